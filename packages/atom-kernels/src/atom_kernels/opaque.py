"""The kernel entry points as opaque torch custom ops while a graph compiler traces them (custom_op.py says
why; each family registers its own ops beside its entry points).

Same arguments as the entry points of the same names, less `out=` buffers and `backend=` (the compiled
graph runs each op with the settings' backend).
"""

from atom_kernels.activation.opaque import silu_and_mul
from atom_kernels.fp8.opaque import fp8_linear
from atom_kernels.linear.opaque import linear
from atom_kernels.moe.opaque import fused_experts, grouped_topk, topk_softmax
from atom_kernels.norm.opaque import rms_norm, rms_norm_gated
from atom_kernels.rotary.opaque import apply_mrope, apply_rotary

__all__ = [
    "apply_mrope",
    "apply_rotary",
    "fp8_linear",
    "fused_experts",
    "grouped_topk",
    "linear",
    "rms_norm",
    "rms_norm_gated",
    "silu_and_mul",
    "topk_softmax",
]
