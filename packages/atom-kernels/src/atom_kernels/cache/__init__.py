"""Paged KV cache: named layouts, writes (bf16/fp16/fp8), layout conversions, rows moved back."""

from atom_kernels.cache.convert import flash_to_shuffle, to_flash
from atom_kernels.cache.fp8 import default_fp8_dtype, fp8_max
from atom_kernels.cache.layout import KVLayout, kv_cache_shapes, shuffle_width
from atom_kernels.cache.move_rows import move_rows_back
from atom_kernels.cache.write import write_kv

__all__ = [
    "KVLayout",
    "default_fp8_dtype",
    "flash_to_shuffle",
    "fp8_max",
    "kv_cache_shapes",
    "move_rows_back",
    "shuffle_width",
    "to_flash",
    "write_kv",
]
