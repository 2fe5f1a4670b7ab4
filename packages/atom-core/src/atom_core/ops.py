"""Kernel entry points as atom_core exposes them (backend chosen by atom_kernels' rules)."""

from atom_kernels import silu_and_mul

__all__ = ["silu_and_mul"]
