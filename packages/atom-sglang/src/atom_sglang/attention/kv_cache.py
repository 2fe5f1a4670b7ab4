"""SGLang's MHA token-to-KV pool, seen as atom-kernels' paged caches (no copy).

NHD pools hold one layer's K as token rows [slots, Hkv, D]; a page is page_size consecutive rows, so the
same memory is the flash layout [pages, page_size, Hkv, D]. ROCm's vectorized_5d pools are already
atom-kernels' shuffle layout. HND pools fold heads into pages and are not supported.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

LAYOUTS = {"nhd": "flash", "vectorized_5d": "shuffle"}
CACHE_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float8_e4m3fn)


class UnsupportedKVPool(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class PoolGeometry:
    layout: str  # atom-kernels' name: "flash" or "shuffle"
    page_size: int
    dtype: torch.dtype


def pool_geometry(pool) -> PoolGeometry:
    """What the atom backend needs to know about a pool; refuses pools it cannot address. A hybrid
    (linear-attention) model's HybridLinearKVPool is described by its dense child, which holds only the
    full-attention layers; the backend keeps reading through the hybrid pool, which maps global layer ids."""
    pool = getattr(pool, "full_kv_pool", pool)
    name = type(pool).__name__
    if not hasattr(pool, "get_key_buffer") or getattr(pool, "v_head_dim", None) != getattr(
        pool, "head_dim", 0
    ):
        raise UnsupportedKVPool(
            f"the atom attention backend needs an MHA KV pool with K and V alike, got {name}"
        )
    layout = getattr(pool, "kv_cache_layout", "nhd")
    if layout not in LAYOUTS:
        raise UnsupportedKVPool(
            f"the atom attention backend reads KV layouts {sorted(LAYOUTS)}, not {layout!r} "
            "(unset SGLANG_USE_HND_KVCACHE)"
        )
    if pool.dtype not in CACHE_DTYPES:
        raise UnsupportedKVPool(f"the atom attention backend has no kernels for a {pool.dtype} KV cache")
    return PoolGeometry(LAYOUTS[layout], pool.page_size, pool.dtype)


def _pages(rows: torch.Tensor, page_size: int) -> torch.Tensor:
    """[slots, Hkv, D] token rows -> [pages, page_size, Hkv, D]; the pool pads its storage to whole pages."""
    slots, heads, dim = rows.shape
    pages = -(-slots // page_size)
    s0, s1, s2 = rows.stride()
    needed = rows.storage_offset() + (pages * page_size - 1) * s0 + (heads - 1) * s1 + (dim - 1) * s2 + 1
    if needed > rows.untyped_storage().nbytes() // rows.element_size():
        raise UnsupportedKVPool(f"KV pool rows ({slots}) are not backed by whole pages of {page_size}")
    return rows.as_strided((pages, page_size, heads, dim), (page_size * s0, s0, s1, s2))


def layer_caches(pool, layer_id: int, geometry: PoolGeometry) -> tuple[torch.Tensor, torch.Tensor]:
    """One layer's (k_cache, v_cache) in geometry.layout, aliasing the pool's buffers."""
    k, v = pool.get_key_buffer(layer_id), pool.get_value_buffer(layer_id)
    if geometry.layout == "flash":
        return _pages(k, geometry.page_size), _pages(v, geometry.page_size)
    return k, v
