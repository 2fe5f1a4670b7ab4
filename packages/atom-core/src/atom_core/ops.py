"""Kernel entry points as atom_core exposes them (backend chosen by atom_kernels' rules).

Adapters' attention backends call these; they never import atom_kernels themselves.
"""

from atom_kernels import apply_rotary, fused_experts, grouped_topk, rms_norm, silu_and_mul, topk_softmax
from atom_kernels.attention import (
    DecodePartition,
    paged_decode,
    paged_decode_persistent,
    paged_prefill,
    plan_decode,
)
from atom_kernels.cache import KVLayout, kv_cache_shapes, write_kv

__all__ = [
    "DecodePartition",
    "KVLayout",
    "apply_rotary",
    "fused_experts",
    "grouped_topk",
    "kv_cache_shapes",
    "paged_decode",
    "paged_decode_persistent",
    "paged_prefill",
    "plan_decode",
    "rms_norm",
    "silu_and_mul",
    "topk_softmax",
    "write_kv",
]
