"""The SGLang attention backend "atom": SGLang's KV pool and scheduler, atom-kernels' paged attention.

It serves any model whose attention goes through RadixAttention (ATOM's wrappers and SGLang's own
models), for EXTEND, MIXED, DECODE, IDLE and chain TARGET_VERIFY batches, eagerly and in decode CUDA graphs.
Responsibilities live beside it: base.py (metadata and graph buffers, shared with the MLA backend in
mla.py), kv_cache.py (the pool as paged caches); the kernels are atom-core's ops.
"""

from __future__ import annotations

import torch
from sglang.srt.layers.radix_attention import AttentionType

from atom_core.integration import paged_attention
from atom_sglang.attention.base import AtomBackendBase, refuse
from atom_sglang.attention.kv_cache import layer_caches, pool_geometry

# RadixAttention keyword arguments this backend implements; any other one that is set is refused by name.
HANDLED_KWARGS = frozenset({"sinks"})


class AtomAttnBackend(AtomBackendBase):
    def __init__(self, model_runner, kernel_backend: str | None = None):
        if model_runner.use_mla_backend:
            raise ValueError("AtomAttnBackend serves MHA/GQA models; MLA models get AtomMLAAttnBackend")
        self.geometry = pool_geometry(model_runner.token_to_kv_pool)
        super().__init__(model_runner, self.geometry.page_size, kernel_backend)
        self.kv_cache_dtype = self.geometry.dtype
        self._scales: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    # -- attention --------------------------------------------------------------------------------------
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
    refuse("atom attention", layer, problems, kwargs, HANDLED_KWARGS)
