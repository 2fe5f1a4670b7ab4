"""ATOM's Gated DeltaNet under vLLM: a mamba-type layer of the adapter's own over vLLM's state cache, and the
"ATOM_GDN" mamba backend that names its metadata builder.

vLLM allocates each GDN layer's states per request (MambaSpec: a conv state and the recurrent state S,
shapes and dtypes from its own calculators) and builds the step's GDNAttentionMetadata with the
backend's builder, a GDNAttentionMetadataBuilder so that vLLM's runner hands it the speculative
arguments. The layer runs atom-core's conv, gating and delta-rule ops on those states in place.

Speculative decoding follows vLLM's layout for GDN. A verifying request owns num_spec + 1 state blocks:
the recurrent state after its t-th token goes to block t, and the next step resumes from block
(accepted - 1). Its conv state is one block (the first) holding W - 1 + num_spec inputs: the inputs
before the step's first token end at column accepted - 1 + W - 2; after the step the buffer holds the
window's last W - 2 inputs, then the step's tokens. Steps without drafts (prefills) use the first
W - 1 columns. Nothing in vLLM is patched.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateDtypeCalculator,
    MambaStateShapeCalculator,
    is_conv_state_dim_first,
)
from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata, GDNAttentionMetadataBuilder
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from atom_core.integration import (
    GDNLayerSpec,
    causal_conv1d,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    gdn_gating,
)
from atom_vllm.attention.opaque import GDN_OP, gdn_attention_op, split_graph_at

GDN_BACKEND_NAME = "ATOM_GDN"
STATE_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}  # what atom-core's GDN ops keep


def vllm_state_dtypes(vllm_config) -> tuple[torch.dtype, torch.dtype]:
    """(conv, recurrent) state dtypes as vLLM resolves them (model dtype unless mamba_*_cache_dtype say)."""
    cache = vllm_config.cache_config
    return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        vllm_config.model_config.dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype
    )


def recurrent_state_dtype(vllm_config) -> str:
    """The recurrent state dtype for atom-core ("float32" / "bfloat16"), or a clear refusal."""
    dtype = vllm_state_dtypes(vllm_config)[1]
    if dtype not in STATE_DTYPES:
        raise NotImplementedError(
            f"ATOM's GDN layers keep the recurrent state in float32 or bfloat16; vLLM resolves it to "
            f"{dtype} for this model: pass mamba_ssm_cache_dtype='float32' (--mamba-ssm-cache-dtype)"
        )
    return STATE_DTYPES[dtype]


class AtomGDNMetadataBuilder(GDNAttentionMetadataBuilder):
    """vLLM's GDN metadata (request split, state blocks, accepted counts). Eager only for now: the layer
    reads the speculative lengths on the host, and decode CUDA graphs under vLLM are untested (the GPU
    machine has no vLLM)."""

    _cudagraph_support = AttentionCGSupport.NEVER


class AtomGDNBackend(AttentionBackend):
    """Gated DeltaNet over vLLM's per-request state blocks."""

    @staticmethod
    def get_name() -> str:
        return GDN_BACKEND_NAME

    @staticmethod
    def get_builder_cls() -> type[AtomGDNMetadataBuilder]:
        return AtomGDNMetadataBuilder

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("ATOM_GDN runs inside ATOM's own GDN layer (VllmGDNLayer)")

    @classmethod
    def is_ssm(cls) -> bool:
        return True


def refuse_cache_mode(mode: str, num_spec: int) -> None:
    """'none': one state per request; 'align' (vLLM's choice with prefix caching): states kept per block at
    block-aligned chunk ends, which vLLM's runner copies between a request's blocks before the step, so the
    layer still reads and writes one slot per request. With speculative decoding, align mode moves the
    per-draft states with vLLM's fused Triton copy kernels, which its CPU build lacks: not verified here."""
    if mode not in ("none", "align"):
        raise NotImplementedError(
            f"ATOM's GDN layers under vLLM support mamba_cache_mode 'none' and 'align', got {mode!r}"
        )
    if mode == "align" and num_spec:
        raise NotImplementedError(
            "ATOM's GDN layers under vLLM do not run prefix caching (mamba_cache_mode 'align') together with "
            f"speculative decoding ({num_spec} speculative tokens): pass enable_prefix_caching=False "
            "(--no-enable-prefix-caching)"
        )


class VllmGDNLayer(nn.Module, MambaBase):
    """atom-core's GDNLayer contract over vLLM's state cache: (mixed [T, conv_dim], b, a [T, HV], conv
    weight [conv_dim, W], A_log, dt_bias [HV]) -> o [T, HV, Dv]."""

    def __init__(self, spec: GDNLayerSpec):
        super().__init__()
        vllm_config = get_current_vllm_config()
        cache = vllm_config.cache_config
        spec_config = vllm_config.speculative_config
        self.num_spec = spec_config.num_speculative_tokens if spec_config is not None else 0
        refuse_cache_mode(cache.mamba_cache_mode, self.num_spec)
        self.spec = spec
        self.layer_name = spec.prefix
        self._dtypes = vllm_state_dtypes(vllm_config)
        if self._dtypes[1] != spec.state_dtype:
            raise ValueError(
                f"{spec.prefix}: built with a {spec.state_dtype} recurrent state, vLLM allocates {self._dtypes[1]}"
            )
        # the heads in spec are this rank's already
        self._shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
            1,
            spec.num_k_heads,
            spec.num_v_heads,
            spec.head_k_dim,
            spec.head_v_dim,
            spec.conv_width,
            self.num_spec,
        )
        self.dim_first = is_conv_state_dim_first()
        self.kv_cache = (torch.tensor([]), torch.tensor([]))  # bound by vLLM's runner
        self.attn_backend, self.sliding_window = AtomGDNBackend, None  # what diagnostics report
        context = vllm_config.compilation_config.static_forward_context
        if spec.prefix in context:
            raise ValueError(f"duplicate layer name {spec.prefix!r} in vLLM's forward context")
        context[spec.prefix] = self
        split_graph_at(vllm_config.compilation_config, GDN_OP)

    @property
    def mamba_type(self):
        return MambaAttentionBackendEnum[GDN_BACKEND_NAME]

    def get_state_shape(self):
        return self._shapes

    def get_state_dtype(self) -> tuple[torch.dtype, torch.dtype]:
        return self._dtypes

    def get_attn_backend(self) -> type[AttentionBackend]:
        return AtomGDNBackend

    def _conv_buffer(self) -> torch.Tensor:
        """The conv states as [blocks, conv_dim, W - 1 + num_spec] (a view, whatever vLLM's orientation)."""
        conv = self.kv_cache[0]
        return conv if self.dim_first else conv.transpose(1, 2)

    def _metadata(self) -> GDNAttentionMetadata | None:
        metadata = get_forward_context().attn_metadata
        if metadata is None:
            return None
        if isinstance(metadata, list):
            raise NotImplementedError("ATOM's GDN under vLLM does not run micro-batched (DBO) steps")
        return metadata.get(self.layer_name)

    def forward(self, mixed, b, a, conv_weight, A_log, dt_bias) -> torch.Tensor:
        """One opaque op when vLLM compiles the model (opaque.py)."""
        if torch.compiler.is_compiling():
            return gdn_attention_op(
                mixed, b, a, conv_weight, A_log, dt_bias, self.spec.head_v_dim, self.layer_name
            )
        return self.run(mixed, b, a, conv_weight, A_log, dt_bias)

    def run(self, mixed, b, a, conv_weight, A_log, dt_bias) -> torch.Tensor:
        """The step (forward's contract): requests without drafts, then those verifying drafts."""
        spec = self.spec
        out = mixed.new_zeros(mixed.shape[0], spec.num_v_heads, spec.head_v_dim)
        meta = self._metadata()
        if meta is None:  # vLLM's profiling and dummy runs
            return out
        n = meta.num_actual_tokens
        weights = (conv_weight, A_log, dt_bias)
        if meta.spec_sequence_masks is None:
            out[:n] = self._plain(mixed[:n], b[:n], a[:n], weights, meta)
            return out
        if meta.num_prefills == 0 and meta.num_decodes == 0:  # every request verifies drafts
            out[:n] = self._verify(mixed[:n], b[:n], a[:n], weights, meta)
            return out
        spec_rows, plain_rows = meta.spec_token_indx.long(), meta.non_spec_token_indx.long()
        out[spec_rows] = self._verify(mixed[spec_rows], b[spec_rows], a[spec_rows], weights, meta)
        out[plain_rows] = self._plain(mixed[plain_rows], b[plain_rows], a[plain_rows], weights, meta)
        return out

    def _plain(self, mixed, b, a, weights, meta: GDNAttentionMetadata) -> torch.Tensor:
        """Requests without drafts (prefills, chunks, decodes): state block 0 of each, the conv state in the
        buffer's first W - 1 columns."""
        conv_weight, A_log, dt_bias = weights
        spec = self.spec
        blocks = meta.non_spec_state_indices_tensor
        cu = meta.non_spec_query_start_loc
        blocks = blocks[: cu.numel() - 1]
        started = meta.has_initial_state  # None: every request continues (a decode-only step)
        if started is not None:
            started = started[: blocks.numel()]
        rows = blocks.long()
        # atom-core's conv takes [slots, D, W-1] with unit last stride: work on a gathered copy of these
        # requests' windows (vLLM's CPU layout is [blocks, W-1, D]; padded requests share the null block)
        window = self._conv_buffer()[rows, :, : spec.conv_width - 1].contiguous()
        own = torch.arange(rows.numel(), dtype=torch.int32, device=mixed.device)
        x = causal_conv1d(
            mixed, conv_weight, None, cu, window, own, has_initial_state=started, activation=spec.conv_silu
        )
        self._conv_buffer()[rows, :, : spec.conv_width - 1] = window
        q, k, v = spec.split_heads(x)
        g, beta = gdn_gating(A_log, a, dt_bias, b)
        rule = gated_delta_rule_chunked if meta.num_prefills > 0 else gated_delta_rule_recurrent
        return rule(q, k, v, g, beta, cu, self.kv_cache[1], blocks, has_initial_state=started)

    def _verify(self, mixed, b, a, weights, meta: GDNAttentionMetadata) -> torch.Tensor:
        """Requests verifying drafts: resume from the accepted token's states, keep the state after each
        token in the request's block for that position."""
        conv_weight, A_log, dt_bias = weights
        spec = self.spec
        count = meta.num_spec_decodes
        blocks = meta.spec_state_indices_tensor[:count]  # [S, num_spec + 1]
        cu = meta.spec_query_start_loc[: count + 1]
        accepted = meta.num_accepted_tokens[:count].long()
        lens = (cu[1:] - cu[:-1]).long()
        width = spec.conv_width
        buffer = self._conv_buffer()
        home = blocks[:, 0].long()
        # the W - 1 inputs before each request's first token
        cols = (accepted - 1)[:, None] + torch.arange(width - 1, device=mixed.device)[None, :]
        window = buffer[
            home[:, None, None],
            torch.arange(buffer.shape[1], device=mixed.device)[None, :, None],
            cols[:, None, :],
        ]
        start_window = window.clone()
        own = torch.arange(count, dtype=torch.int32, device=mixed.device)
        x = causal_conv1d(mixed, conv_weight, None, cu, window, own, activation=spec.conv_silu)
        # the buffer keeps the window's last W - 2 inputs, then the step's tokens, so that the next step's
        # window (accepted' - 1 columns in) ends at its last accepted token
        for i, (row, length, first) in enumerate(
            zip(home.tolist(), lens.tolist(), cu[:-1].tolist(), strict=True)
        ):
            kept = start_window[i, :, 1:]
            buffer[row, :, : width - 2 + length] = torch.cat(
                [kept, mixed[first : first + length].T.to(kept.dtype)], 1
            )
        q, k, v = spec.split_heads(x)
        g, beta = gdn_gating(A_log, a, dt_bias, b)
        resume = blocks.gather(1, (accepted - 1)[:, None]).squeeze(1)
        request = torch.repeat_interleave(torch.arange(count, device=mixed.device), lens)
        position = torch.arange(mixed.shape[0], device=mixed.device) - cu[:-1].long()[request]
        steps = blocks[request, position]
        return gated_delta_rule_recurrent(
            q, k, v, g, beta, cu, self.kv_cache[1], resume, step_state_indices=steps
        )
