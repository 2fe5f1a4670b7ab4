"""One layer's attention forward under vLLM, through atom-core's paged_attention."""

from __future__ import annotations

import torch
from vllm.v1.attention.backend import AttentionImpl, AttentionType

from atom_core.integration import paged_attention
from atom_vllm.attention.metadata import AtomAttentionMetadata


class AtomAttentionImpl(AttentionImpl[AtomAttentionMetadata]):
    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
        **unsupported,
    ) -> None:
        """sinks: [num_heads] learned sink logits (GPT-OSS), read at each forward."""
        options = dict(
            unsupported,
            alibi_slopes=alibi_slopes,
            logits_soft_cap=logits_soft_cap,
            kv_sharing_target_layer_name=kv_sharing_target_layer_name,
        )
        refused = sorted(name for name, value in options.items() if _is_set(value))
        if refused or attn_type != AttentionType.DECODER:
            raise NotImplementedError(
                f"the ATOM attention backend does not support {refused or [attn_type]} yet"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.sliding_window = sliding_window
        self.kv_cache_dtype = kv_cache_dtype
        if sinks is not None and tuple(sinks.shape) != (num_heads,):
            raise ValueError(f"attention sinks must be [num_heads={num_heads}], got {tuple(sinks.shape)}")
        self.sinks = sinks

    def forward(
        self,
        layer: torch.nn.Module,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: AtomAttentionMetadata | None,
        output: torch.Tensor,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """query [T, Hq, D], key/value [T, Hkv, D], kv_cache [blocks, Hkv, page, 2*D] (vLLM's per-layer view,
        K then V in the last dim, strides as vLLM's cache layout has them) -> output [T, Hq, D]."""
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("the ATOM attention backend does not fuse output quantization")
        if attn_metadata is None:  # vLLM's profiling / dummy runs
            return output.fill_(0)
        n = attn_metadata.num_actual_tokens
        pages = kv_cache.transpose(1, 2)  # [blocks, page, Hkv, 2*D]: atom's flash layout, K|V packed
        k_cache, v_cache = pages[..., : self.head_size], pages[..., self.head_size :]
        paged_attention(
            query[:n],
            key[:n],
            value[:n],
            k_cache,
            v_cache,
            attn_metadata.paged,
            softmax_scale=self.scale,
            sliding_window=self.sliding_window,
            sinks=None if self.sinks is None else self.sinks.float(),
            out=output[:n],
        )
        return output


def _is_set(value) -> bool:
    """Whether an optional attention feature was asked for (values may be tensors, e.g. sinks)."""
    return value is not None and value is not False and not (isinstance(value, int) and value == -1)
