"""How a kernel entry point becomes an opaque torch custom op while a graph compiler traces it.

Why: the entry points choose kernels in Python from shapes and devices (GEMV, skinny GEMM or cuBLAS by row
count, MoE tile shapes, the one-program ordering), and some torch references loop over data (the experts').
A graph traced once (torch.compile, vLLM's compiled path) would freeze those choices at the traced shape,
and Dynamo cannot trace the Triton interpreter at all. Under tracing each family's `opaque.py` function is one
`atom_kernels::<name>` op whose fake implementation gives only its outputs' shapes; the op runs the same
entry point when the graph runs. Called eagerly, the functions go straight to the entry points, with no
dispatcher in between.

Each family registers its ops beside its entry points (linear/, fp8/, norm/, activation/, rotary/, moe/);
atom_kernels.opaque gathers them.
"""

from __future__ import annotations

import torch

Tensor = torch.Tensor


def opaque(name: str, impl, fake, mutates: tuple[str, ...] = ()):
    """impl registered as the custom op atom_kernels::<name> (fake: its outputs' shapes) -> the op. impl
    stays a plain function, the eager path."""
    op = torch.library.custom_op(f"atom_kernels::{name}", mutates_args=mutates)(impl)
    op.register_fake(fake)
    return op


def pick(op, impl):
    """The op while Dynamo traces, else the plain function (no dispatcher on the eager path)."""
    return op if torch.compiler.is_compiling() else impl


def like_x(x: Tensor, *args) -> Tensor:
    """A fake output shaped and typed as the first input."""
    return torch.empty_like(x, memory_format=torch.contiguous_format)
