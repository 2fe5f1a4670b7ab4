"""The SGLang attention backend "atom": SGLang's KV pool and scheduler, atom-kernels' paged attention.

It serves any model whose attention goes through RadixAttention (ATOM's wrappers and SGLang's own
models), for EXTEND, MIXED, DECODE, IDLE and chain TARGET_VERIFY batches, eagerly and in decode CUDA graphs.
Responsibilities live beside it: metadata.py (ForwardBatch -> page tables), kv_cache.py (the pool as
paged caches), graph_state.py (static buffers for graphs); the kernels are atom-core's ops.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.attention.base_attn_backend import AttentionBackend
from sglang.srt.layers.radix_attention import AttentionType

from atom_core.integration import paged_attention
from atom_sglang.attention.graph_state import DecodeGraphState
from atom_sglang.attention.kv_cache import layer_caches, pool_geometry
from atom_sglang.attention.metadata import AtomForwardMetadata, UnsupportedForwardMode, build_metadata

# RadixAttention keyword arguments this backend implements; any other one that is set is refused by name.
HANDLED_KWARGS = frozenset({"sinks"})


class AtomAttnBackend(AttentionBackend):
    def __init__(self, model_runner, kernel_backend: str | None = None):
        super().__init__()
        if model_runner.use_mla_backend:
            raise ValueError("the atom attention backend serves MHA/GQA models; this model uses MLA")
        self.device = model_runner.device
        self.req_to_token_pool = model_runner.req_to_token_pool
        self.token_to_kv_pool = model_runner.token_to_kv_pool
        self.geometry = pool_geometry(self.token_to_kv_pool)
        self.kernel_backend = kernel_backend  # None: atom-kernels picks (Triton on GPUs, torch on the CPU)
        self.data_type = getattr(model_runner, "dtype", None)
        self.kv_cache_dtype = self.geometry.dtype
        self.forward_metadata: AtomForwardMetadata | None = None
        self.graph_state: DecodeGraphState | None = None
        self._scales: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    # -- metadata ---------------------------------------------------------------------------------------
    def init_forward_metadata(self, forward_batch):
        if forward_batch.forward_mode.is_idle():
            self.forward_metadata = None
            return
        req_to_token = self.req_to_token_pool.req_to_token
        self.forward_metadata = build_metadata(forward_batch, req_to_token, self.geometry.page_size)

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int):
        max_context_len = self.req_to_token_pool.req_to_token.shape[1]
        self.graph_state = DecodeGraphState(
            max_bs, max_num_tokens, max_context_len, self.geometry.page_size, self.device
        )

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False):
        mode = forward_batch.forward_mode
        if not (mode.is_decode_or_idle() or mode.is_target_verify()):
            raise UnsupportedForwardMode(
                f"the atom attention backend captures DECODE and TARGET_VERIFY graphs, not {mode.name}"
            )
        if self.graph_state is None:
            raise RuntimeError("init_cuda_graph_state must run before graph metadata is prepared")
        self.forward_metadata = self.graph_state.update(forward_batch, self.req_to_token_pool.req_to_token)

    def get_cuda_graph_seq_len_fill_value(self):
        return 1

    # -- attention --------------------------------------------------------------------------------------
    def forward_decode(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._attend(q, k, v, layer, save_kv_cache, kwargs)

    def forward_extend(self, q, k, v, layer, forward_batch, save_kv_cache=True, **kwargs):
        return self._attend(q, k, v, layer, save_kv_cache, kwargs)

    def _attend(self, q, k, v, layer, save_kv_cache: bool, kwargs: dict) -> torch.Tensor:
        """q: [T, Hq * D] (or [T, Hq, D]); k, v: [T, Hkv * D] -> [T, Hq * D]. atom-core's paged_attention
        writes K/V (unless SGLang saved them already) and picks the kernel from the metadata."""
        _refuse_unsupported(layer, kwargs)
        hq, d, hkv = layer.tp_q_head_num, layer.qk_head_dim, layer.tp_k_head_num
        k_cache, v_cache = layer_caches(self.token_to_kv_pool, layer.layer_id, self.geometry)
        write = save_kv_cache and k is not None
        window = layer.sliding_window_size
        out = paged_attention(
            q.reshape(-1, hq, d),
            k.reshape(-1, hkv, d) if write else None,
            v.reshape(-1, hkv, d) if write else None,
            k_cache,
            v_cache,
            self.forward_metadata.paged,
            layout=self.geometry.layout,
            softmax_scale=layer.scaling,
            # SGLang's window s sees q - k <= s; atom-core's W sees q - k < W.
            sliding_window=window + 1 if window is not None and window >= 0 else None,
            softcap=layer.logit_cap if layer.logit_cap and layer.logit_cap > 0 else None,
            sinks=_float(kwargs.get("sinks")),
            kernel_backend=self.kernel_backend,
            **self._kv_scales(layer),
        )
        return out.reshape(-1, hq * d)

    def _kv_scales(self, layer) -> dict:
        """Per-tensor fp8 scales (SGLang's checkpoint k_scale/v_scale, else 1.0); nothing for other dtypes."""
        if self.geometry.dtype != torch.float8_e4m3fn:
            return {}
        if layer.layer_id not in self._scales:
            k = layer.k_scale_float if layer.k_scale_float is not None else 1.0
            v = layer.v_scale_float if layer.v_scale_float is not None else 1.0
            self._scales[layer.layer_id] = tuple(
                torch.tensor([s], dtype=torch.float32, device=self.device) for s in (k, v)
            )
        k_scale, v_scale = self._scales[layer.layer_id]
        return {"k_scale": k_scale, "v_scale": v_scale}


def _float(t: torch.Tensor | None) -> torch.Tensor | None:
    return None if t is None else t.float()


def _refuse_unsupported(layer, kwargs: dict) -> None:
    """Fail loudly, naming the feature, instead of silently computing something else."""
    problems = []
    if layer.is_cross_attention or layer.attn_type != AttentionType.DECODER:
        problems.append(
            f"attention type {layer.attn_type.value}{' (cross)' if layer.is_cross_attention else ''}"
        )
    if layer.v_head_dim != layer.qk_head_dim:
        problems.append(f"v_head_dim {layer.v_head_dim} != qk_head_dim {layer.qk_head_dim}")
    if layer.logit_cap and layer.logit_cap > 0 and layer.logit_capping_method != "tanh":
        problems.append(f"logit capping method {layer.logit_capping_method!r}")
    problems += [
        f"argument {name!r}"
        for name, value in kwargs.items()
        if value is not None and value is not False and name not in HANDLED_KWARGS
    ]
    if problems:
        raise NotImplementedError(
            f"the atom attention backend does not support {', '.join(problems)} (layer {layer.layer_id})"
        )
