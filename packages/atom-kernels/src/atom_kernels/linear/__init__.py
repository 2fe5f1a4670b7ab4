"""Linear layers at decode's few rows: a weight-streaming GEMV/skinny GEMM, cuBLAS beyond."""

from atom_kernels.linear.skinny import MAX_SKINNY_ROWS, linear

__all__ = ["MAX_SKINNY_ROWS", "linear"]
