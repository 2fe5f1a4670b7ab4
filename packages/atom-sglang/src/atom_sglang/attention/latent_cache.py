"""SGLang's MLA token-to-KV pool seen as atom-kernels' paged latent cache (no copy).

`MLATokenToKVPool` keeps one tensor per layer, [slots, 1, kv_lora_rank + rope] (fp8 pools store uint8 and
hand out an e4m3 view); the value is the first kv_lora_rank columns of the same row. Slot s sits at page
s // page_size, offset s % page_size, so the rows are already atom-kernels' latent cache [pages, page, R + P].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_sglang.attention.kv_cache import UnsupportedKVPool

LATENT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)


@dataclass(frozen=True, slots=True)
class LatentGeometry:
    page_size: int
    kv_lora_rank: int
    rope_dim: int
    dtype: torch.dtype  # what the kernels read (e4m3 for SGLang's uint8-stored fp8 pools)


def latent_geometry(pool) -> LatentGeometry:
    """The latent pool's shape, refusing pools the MLA kernels cannot address."""
    name = type(pool).__name__
    if not hasattr(pool, "kv_lora_rank") or not hasattr(pool, "qk_rope_head_dim"):
        raise UnsupportedKVPool(f"the atom MLA backend needs SGLang's MLA KV pool, got {name}")
    if getattr(pool, "use_dsa", False) or getattr(pool, "override_kv_cache_dim", None):
        raise UnsupportedKVPool(f"the atom MLA backend reads plain latent rows; {name} is a DSA/NSA pool")
    if pool.dtype not in LATENT_DTYPES:
        raise UnsupportedKVPool(f"the atom MLA backend has no kernels for a {pool.dtype} latent cache")
    if pool.qk_rope_head_dim <= 0:
        raise UnsupportedKVPool("the atom MLA backend needs a rotary part (qk_rope_head_dim > 0)")
    return LatentGeometry(pool.page_size, pool.kv_lora_rank, pool.qk_rope_head_dim, pool.dtype)


def latent_cache(pool, layer_id: int, geometry: LatentGeometry) -> torch.Tensor:
    """One layer's rows as [pages, page_size, R + P], aliasing the pool's buffer."""
    rows = pool.get_key_buffer(layer_id)
    slots, width = rows.shape[0], geometry.kv_lora_rank + geometry.rope_dim
    if rows.shape[1:] != (1, width) or not rows.is_contiguous():
        raise UnsupportedKVPool(
            f"latent rows must be contiguous [slots, 1, {width}], got {tuple(rows.shape)}"
        )
    if slots % geometry.page_size:
        raise UnsupportedKVPool(f"latent pool rows ({slots}) are not whole pages of {geometry.page_size}")
    return rows.view(slots // geometry.page_size, geometry.page_size, width)
