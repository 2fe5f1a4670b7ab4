"""Collectives over peer memory (tensor parallelism on one host)."""

from atom_kernels.comm.all_reduce_norm import (
    MAX_ROWS,
    all_reduce_rms_norm,
    all_reduce_rms_norm_ref,
    fused_buffer_bytes,
)
from atom_kernels.comm.one_shot import MAX_PROGRAMS, all_reduce_ref, one_shot_all_reduce, pad_slots

__all__ = [
    "MAX_PROGRAMS",
    "MAX_ROWS",
    "all_reduce_ref",
    "all_reduce_rms_norm",
    "all_reduce_rms_norm_ref",
    "fused_buffer_bytes",
    "one_shot_all_reduce",
    "pad_slots",
]
