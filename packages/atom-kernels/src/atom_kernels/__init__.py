"""ATOM kernels: Triton kernels for LLM inference, each with a pure-torch reference.

Public functions take tensors with shapes in their docstrings and an optional ``out=``; the
backend is an explicit argument, else the settings default, else chosen by device.
"""

from atom_kernels.activation import silu_and_mul
from atom_kernels.moe import fused_experts, grouped_topk, topk_softmax
from atom_kernels.norm import rms_norm, rms_norm_gated
from atom_kernels.rotary import apply_mrope, apply_rotary
from atom_kernels.settings import Backend, resolve_backend

__version__ = "0.1.0"

__all__ = [
    "Backend",
    "__version__",
    "apply_mrope",
    "apply_rotary",
    "fused_experts",
    "grouped_topk",
    "resolve_backend",
    "rms_norm",
    "rms_norm_gated",
    "silu_and_mul",
    "topk_softmax",
]
