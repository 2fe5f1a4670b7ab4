"""The "atom" backend for MLA models (DeepSeek-V2/V3): SGLang's latent pool, atom-core's absorbed mla_step.

SGLang picks it when its runner uses MLA (the checkpoint's architecture says so). Every query head attends
over the same cached latent row [kv_lora_rank | rope] per token and the output stays latent
([kv_lora_rank] per head); the caller maps it back through W_UV. It accepts the three ways SGLang's MLA
callers hand over the step's latent:
  - q [T, H*(R+P)], k = [latent | rope] [T, 1, R+P], v = latent [T, 1, R]  (SGLang's DeepSeek on most
    backends, and ATOM's models);
  - q [T, H*R] with q_rope [T, H, P], k = latent [T, 1, R], k_rope [T, 1, P]  (the split keywords);
  - k = v = None: the caller wrote the rows itself (SGLang's MLA test kit).
"""

from __future__ import annotations

import torch

from atom_core.integration import mla_step
from atom_sglang.attention.base import AtomBackendBase, refuse
from atom_sglang.attention.latent_cache import latent_cache, latent_geometry

# Keywords SGLang's MLA callers may pass that this backend implements; any other set one is refused.
HANDLED_KWARGS = frozenset({"q_rope", "k_rope"})


class AtomMLAAttnBackend(AtomBackendBase):
    def __init__(self, model_runner, kernel_backend: str | None = None):
        if not model_runner.use_mla_backend:
            raise ValueError("AtomMLAAttnBackend serves MLA models; MHA/GQA models get AtomAttnBackend")
        self.geometry = latent_geometry(model_runner.token_to_kv_pool)
        super().__init__(model_runner, self.geometry.page_size, kernel_backend)
        self.kv_cache_dtype = self.geometry.dtype
        self._scales: dict[int, torch.Tensor] = {}

    def _attend(self, q, k, v, layer, save_kv_cache: bool, kwargs: dict) -> torch.Tensor:
        """-> [T, H * kv_lora_rank]: the latent output of every head (conventions in the module docstring)."""
        _refuse_unsupported(layer, kwargs, self.geometry.kv_lora_rank, self.geometry.rope_dim)
        g, h = self.geometry, layer.tp_q_head_num
        rank, width = g.kv_lora_rank, g.kv_lora_rank + g.rope_dim
        q_rope, k_rope = kwargs.get("q_rope"), kwargs.get("k_rope")
        tokens = q.shape[0]
        if q_rope is not None:
            q = torch.cat([q.reshape(tokens, h, rank), q_rope.reshape(tokens, h, g.rope_dim)], dim=-1)
        else:
            q = q.reshape(tokens, h, width)
        cache = latent_cache(self.token_to_kv_pool, layer.layer_id, g)
        scale = self._scale(layer)
        kv_c = k_pe = None  # None: the caller wrote the rows
        if save_kv_cache and k is not None:
            if k_rope is not None:
                kv_c, k_pe = k.reshape(-1, rank), k_rope.reshape(-1, g.rope_dim)
            else:
                rows = k.reshape(-1, width)
                kv_c, k_pe = rows[:, :rank], rows[:, rank:]
        out = mla_step(
            q,
            kv_c,
            k_pe,
            cache,
            self.forward_metadata.paged,
            kv_lora_rank=rank,
            softmax_scale=layer.scaling,
            scale=scale,
            kernel_backend=self.kernel_backend,
        )
        return out.reshape(tokens, h * rank)

    def _scale(self, layer) -> torch.Tensor | None:
        """fp8 pools: the layer's per-tensor k_scale (SGLang's checkpoint value, else 1.0) divides the rows
        on write and multiplies them back on read; other dtypes store the latent as is."""
        if self.geometry.dtype != torch.float8_e4m3fn:
            return None
        if layer.layer_id not in self._scales:
            k = layer.k_scale_float if layer.k_scale_float is not None else 1.0
            self._scales[layer.layer_id] = torch.tensor([k], dtype=torch.float32, device=self.device)
        return self._scales[layer.layer_id]


def _refuse_unsupported(layer, kwargs: dict, rank: int, rope: int) -> None:
    """Fail loudly, naming what differs, instead of computing something else."""
    problems = []
    if layer.tp_k_head_num != 1 or layer.v_head_dim != rank or layer.qk_head_dim != rank + rope:
        problems.append(
            f"a layer of {layer.tp_k_head_num} kv heads, qk {layer.qk_head_dim}, v {layer.v_head_dim} "
            f"(absorbed MLA needs 1 latent head, qk {rank + rope}, v {rank}: the un-absorbed MHA prefill "
            "is not implemented)"
        )
    if layer.is_cross_attention or layer.sliding_window_size not in (None, -1):
        problems.append("cross attention or a sliding window")
    if layer.logit_cap and layer.logit_cap > 0:
        problems.append("logit capping")
    refuse("atom MLA", layer, problems, kwargs, HANDLED_KWARGS)
