"""The kernel entry points as opaque torch custom ops while a graph compiler traces them.

Why: the entry points choose kernels in Python from shapes and devices (GEMV, skinny GEMM or cuBLAS by row
count, MoE tile shapes, the one-program ordering), and some torch references loop over data (the experts').
A graph traced once (torch.compile, vLLM's compiled path) would freeze those choices at the traced shape,
and Dynamo cannot trace the Triton interpreter at all. Under tracing each function below is one
`atom_kernels::<name>` op whose fake implementation gives only its outputs' shapes; the op runs the same
entry point when the graph runs. Called eagerly, the functions go straight to the entry points, with no
dispatcher in between.

Same arguments as the entry points of the same names, less `out=` buffers and `backend=` (the compiled
graph runs each op with the settings' backend).
"""

from __future__ import annotations

import torch

from atom_kernels import activation, moe, norm, rotary
from atom_kernels.fp8.linear import fp8_linear as _fp8_linear
from atom_kernels.linear import linear as _linear
from atom_kernels.moe import ExpertScales

Tensor = torch.Tensor


def _compiling() -> bool:
    return torch.compiler.is_compiling()


@torch.library.custom_op("atom_kernels::linear", mutates_args=())
def _linear_op(x: Tensor, weight: Tensor, bias: Tensor | None, gated_input: bool) -> Tensor:
    return _linear(x, weight, bias, gated_input=gated_input)


@_linear_op.register_fake
def _(x, weight, bias, gated_input):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, gated_input: bool = False) -> Tensor:
    """atom_kernels.linear.linear: x [..., K] (or [..., 2K] with gated_input), weight [N, K] -> [..., N]."""
    if _compiling():
        return _linear_op(x, weight, bias, gated_input)
    return _linear(x, weight, bias, gated_input=gated_input)


@torch.library.custom_op("atom_kernels::fp8_linear", mutates_args=())
def _fp8_linear_op(
    x: Tensor, weight: Tensor, scale: Tensor, block: list[int], bias: Tensor | None, pow2_scales: bool
) -> Tensor:
    return _fp8_linear(x, weight, scale, (block[0], block[1]), bias, pow2_scales=pow2_scales)


@_fp8_linear_op.register_fake
def _(x, weight, scale, block, bias, pow2_scales):
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def fp8_linear(
    x: Tensor,
    weight: Tensor,
    scale: Tensor,
    block: tuple[int, int],
    bias: Tensor | None = None,
    *,
    pow2_scales: bool = False,
) -> Tensor:
    """atom_kernels.fp8.fp8_linear: x [..., K], e4m3 weight [N, K] with block scales -> [..., N]."""
    if _compiling():
        return _fp8_linear_op(x, weight, scale, list(block), bias, pow2_scales)
    return _fp8_linear(x, weight, scale, block, bias, pow2_scales=pow2_scales)


@torch.library.custom_op("atom_kernels::rms_norm", mutates_args=())
def _rms_norm_op(x: Tensor, weight: Tensor, eps: float, weight_offset: float) -> Tensor:
    return norm.rms_norm(x, weight, eps, weight_offset=weight_offset)


@_rms_norm_op.register_fake
def _(x, weight, eps, weight_offset):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.custom_op("atom_kernels::rms_norm_residual", mutates_args=())
def _rms_norm_residual_op(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor, weight_offset: float
) -> tuple[Tensor, Tensor]:
    return norm.rms_norm(x, weight, eps, residual, weight_offset=weight_offset)


@_rms_norm_residual_op.register_fake
def _(x, weight, eps, residual, weight_offset):
    return (
        torch.empty_like(x, memory_format=torch.contiguous_format),
        torch.empty_like(x, memory_format=torch.contiguous_format),
    )


def rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None, *, weight_offset: float = 0.0
) -> Tensor | tuple[Tensor, Tensor]:
    """atom_kernels.rms_norm: x [T, H] -> out [T, H], or (out, x + residual) with a residual."""
    if _compiling():
        if residual is None:
            return _rms_norm_op(x, weight, eps, weight_offset)
        return _rms_norm_residual_op(x, weight, eps, residual, weight_offset)
    return norm.rms_norm(x, weight, eps, residual, weight_offset=weight_offset)


@torch.library.custom_op("atom_kernels::rms_norm_gated", mutates_args=())
def _rms_norm_gated_op(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    return norm.rms_norm_gated(x, gate, weight, eps)


@_rms_norm_gated_op.register_fake
def _(x, gate, weight, eps):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def rms_norm_gated(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """atom_kernels.rms_norm_gated: x, gate [N, D] -> [N, D]."""
    if _compiling():
        return _rms_norm_gated_op(x, gate, weight, eps)
    return norm.rms_norm_gated(x, gate, weight, eps)


@torch.library.custom_op("atom_kernels::silu_and_mul", mutates_args=())
def _silu_and_mul_op(x: Tensor) -> Tensor:
    return activation.silu_and_mul(x)


@_silu_and_mul_op.register_fake
def _(x):
    return x.new_empty((x.shape[0], x.shape[1] // 2))


def silu_and_mul(x: Tensor) -> Tensor:
    """atom_kernels.silu_and_mul: x [T, 2I] -> [T, I]."""
    if _compiling():
        return _silu_and_mul_op(x)
    return activation.silu_and_mul(x)


@torch.library.custom_op("atom_kernels::apply_rotary", mutates_args=("q", "k"))
def _apply_rotary_op(
    positions: Tensor, q: Tensor, k: Tensor, inv_freq: Tensor, rotary_dim: int, scaling: float, neox: bool
) -> None:
    rotary.apply_rotary(positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=scaling, neox=neox)


@_apply_rotary_op.register_fake
def _(positions, q, k, inv_freq, rotary_dim, scaling, neox):
    return None


def apply_rotary(
    positions: Tensor,
    q: Tensor,
    k: Tensor,
    inv_freq: Tensor,
    *,
    rotary_dim: int,
    scaling: float = 1.0,
    neox: bool = True,
) -> tuple[Tensor, Tensor]:
    """atom_kernels.apply_rotary: rotates q [T, Hq, D] and k [T, Hkv, D] in place; returns (q, k)."""
    if _compiling():
        _apply_rotary_op(positions, q, k, inv_freq, rotary_dim, scaling, neox)
        return q, k
    return rotary.apply_rotary(positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=scaling, neox=neox)


@torch.library.custom_op("atom_kernels::apply_mrope", mutates_args=("q", "k"))
def _apply_mrope_op(
    positions: Tensor,
    q: Tensor,
    k: Tensor,
    inv_freq: Tensor,
    rotary_dim: int,
    section: list[int],
    interleaved: bool,
    scaling: float,
    neox: bool,
) -> None:
    rotary.apply_mrope(
        positions,
        q,
        k,
        inv_freq,
        rotary_dim=rotary_dim,
        section=section,
        interleaved=interleaved,
        scaling=scaling,
        neox=neox,
    )


@_apply_mrope_op.register_fake
def _(positions, q, k, inv_freq, rotary_dim, section, interleaved, scaling, neox):
    return None


def apply_mrope(
    positions: Tensor,
    q: Tensor,
    k: Tensor,
    inv_freq: Tensor,
    *,
    rotary_dim: int,
    section: tuple[int, int, int] | list[int],
    interleaved: bool,
    scaling: float = 1.0,
    neox: bool = True,
) -> tuple[Tensor, Tensor]:
    """atom_kernels.apply_mrope: rotates q and k in place by positions [3, T]; returns (q, k)."""
    if _compiling():
        _apply_mrope_op(positions, q, k, inv_freq, rotary_dim, list(section), interleaved, scaling, neox)
        return q, k
    return rotary.apply_mrope(
        positions,
        q,
        k,
        inv_freq,
        rotary_dim=rotary_dim,
        section=section,
        interleaved=interleaved,
        scaling=scaling,
        neox=neox,
    )


@torch.library.custom_op("atom_kernels::topk_softmax", mutates_args=())
def _topk_softmax_op(
    logits: Tensor, top_k: int, renormalize: bool, round_to: torch.dtype
) -> tuple[Tensor, Tensor]:
    return moe.topk_softmax(logits, top_k, renormalize, round_to=round_to)


def _routing_fake(logits: Tensor, top_k: int) -> tuple[Tensor, Tensor]:
    rows = logits.shape[0]
    return (
        logits.new_empty((rows, top_k), dtype=torch.float32),
        logits.new_empty((rows, top_k), dtype=torch.int32),
    )


@_topk_softmax_op.register_fake
def _(logits, top_k, renormalize, round_to):
    return _routing_fake(logits, top_k)


def topk_softmax(
    logits: Tensor, top_k: int, renormalize: bool, *, round_to: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """atom_kernels.topk_softmax: logits [T, E] -> (weights [T, k] fp32, ids [T, k] int32)."""
    if _compiling():
        return _topk_softmax_op(logits, top_k, renormalize, round_to)
    return moe.topk_softmax(logits, top_k, renormalize, round_to=round_to)


@torch.library.custom_op("atom_kernels::grouped_topk", mutates_args=())
def _grouped_topk_op(
    logits: Tensor,
    top_k: int,
    num_groups: int,
    topk_groups: int,
    bias: Tensor | None,
    scoring: str,
    renormalize: bool,
    scaling: float,
) -> tuple[Tensor, Tensor]:
    return moe.grouped_topk(
        logits,
        top_k,
        num_groups=num_groups,
        topk_groups=topk_groups,
        bias=bias,
        scoring=scoring,
        renormalize=renormalize,
        scaling=scaling,
    )


@_grouped_topk_op.register_fake
def _(logits, top_k, num_groups, topk_groups, bias, scoring, renormalize, scaling):
    return _routing_fake(logits, top_k)


def grouped_topk(
    logits: Tensor,
    top_k: int,
    *,
    num_groups: int,
    topk_groups: int,
    bias: Tensor | None = None,
    scoring: str = "sigmoid",
    renormalize: bool = True,
    scaling: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """atom_kernels.grouped_topk: logits [T, E] -> (weights [T, k] fp32, ids [T, k] int32)."""
    if _compiling():
        return _grouped_topk_op(logits, top_k, num_groups, topk_groups, bias, scoring, renormalize, scaling)
    return moe.grouped_topk(
        logits,
        top_k,
        num_groups=num_groups,
        topk_groups=topk_groups,
        bias=bias,
        scoring=scoring,
        renormalize=renormalize,
        scaling=scaling,
    )


@torch.library.custom_op("atom_kernels::fused_experts", mutates_args=())
def _fused_experts_op(
    x: Tensor,
    w13: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    w13_scale: Tensor | None,
    w2_scale: Tensor | None,
    scale_block: list[int] | None,
) -> Tensor:
    return moe.fused_experts(
        x, w13, w2, topk_weights, topk_ids, scales=_scales(w13_scale, w2_scale, scale_block)
    )


@_fused_experts_op.register_fake
def _(x, w13, w2, topk_weights, topk_ids, w13_scale, w2_scale, scale_block):
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _scales(w13: Tensor | None, w2: Tensor | None, block: list[int] | None) -> ExpertScales | None:
    if w13 is None or w2 is None or block is None:
        return None
    return ExpertScales(w13, w2, (block[0], block[1]))


def fused_experts(
    x: Tensor,
    w13: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    *,
    scales: ExpertScales | None = None,
) -> Tensor:
    """atom_kernels.fused_experts: x [T, H], experts w13 [E, 2I, H], w2 [E, H, I], routing [T, k] -> [T, H]."""
    if _compiling():
        if scales is None:
            return _fused_experts_op(x, w13, w2, topk_weights, topk_ids, None, None, None)
        return _fused_experts_op(
            x, w13, w2, topk_weights, topk_ids, scales.w13, scales.w2, list(scales.block)
        )
    return moe.fused_experts(x, w13, w2, topk_weights, topk_ids, scales=scales)


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
