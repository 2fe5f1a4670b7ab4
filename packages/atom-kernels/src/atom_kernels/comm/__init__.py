"""Collectives over peer memory (tensor parallelism on one host)."""

from atom_kernels.comm.one_shot import MAX_PROGRAMS, all_reduce_ref, one_shot_all_reduce, pad_slots

__all__ = ["MAX_PROGRAMS", "all_reduce_ref", "one_shot_all_reduce", "pad_slots"]
