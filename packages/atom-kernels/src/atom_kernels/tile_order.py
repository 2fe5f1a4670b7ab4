"""The order a GEMM's programs take its output tiles in, shared by the dense and the expert GEMMs."""

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, tiles_m, tiles_n, GROUP_M: tl.constexpr):
    """Program pid's output tile (pid_m, pid_n): GROUP_M row tiles walk the n tiles together, so their A
    rows (and W columns, for a dense GEMM) stay in L2 while the group runs."""
    per_group = GROUP_M * tiles_n
    first_m = (pid // per_group) * GROUP_M
    size_m = tl.minimum(tiles_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % size_m, (pid % per_group) // size_m
