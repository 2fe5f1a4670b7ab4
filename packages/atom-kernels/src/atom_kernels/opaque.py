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


def _opaque(name: str, impl, fake, mutates: tuple[str, ...] = ()):
    """impl registered as the custom op atom_kernels::<name> (fake: its outputs' shapes) -> the op. impl
    stays a plain function, the eager path."""
    op = torch.library.custom_op(f"atom_kernels::{name}", mutates_args=mutates)(impl)
    op.register_fake(fake)
    return op


def _pick(op, impl):
    """The op while Dynamo traces, else the plain function (no dispatcher on the eager path)."""
    return op if torch.compiler.is_compiling() else impl


def _like_x(x: Tensor, *args) -> Tensor:
    return torch.empty_like(x, memory_format=torch.contiguous_format)


def _routing_fake(logits: Tensor, top_k: int, *args) -> tuple[Tensor, Tensor]:
    rows = logits.shape[0]
    return (
        logits.new_empty((rows, top_k), dtype=torch.float32),
        logits.new_empty((rows, top_k), dtype=torch.int32),
    )


def _linear_impl(x: Tensor, weight: Tensor, bias: Tensor | None, gated_input: bool) -> Tensor:
    return _linear(x, weight, bias, gated_input=gated_input)


_linear_op = _opaque(
    "linear", _linear_impl, lambda x, weight, *args: x.new_empty((*x.shape[:-1], weight.shape[0]))
)


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None, *, gated_input: bool = False) -> Tensor:
    """atom_kernels.linear.linear: x [..., K] (or [..., 2K] with gated_input), weight [N, K] -> [..., N]."""
    return _pick(_linear_op, _linear_impl)(x, weight, bias, gated_input)


def _fp8_linear_impl(
    x: Tensor,
    weight: Tensor,
    scale: Tensor,
    block: list[int],
    bias: Tensor | None,
    pow2_scales: bool,
    gated_input: bool,
) -> Tensor:
    blk = (block[0], block[1])
    return _fp8_linear(x, weight, scale, blk, bias, pow2_scales=pow2_scales, gated_input=gated_input)


_fp8_linear_op = _opaque(
    "fp8_linear", _fp8_linear_impl, lambda x, weight, *args: x.new_empty((*x.shape[:-1], weight.shape[0]))
)


def fp8_linear(
    x: Tensor,
    weight: Tensor,
    scale: Tensor,
    block: tuple[int, int],
    bias: Tensor | None = None,
    *,
    pow2_scales: bool = False,
    gated_input: bool = False,
) -> Tensor:
    """atom_kernels.fp8.fp8_linear: x [..., K] (or [..., 2K], gate | up, with gated_input), e4m3 weight
    [N, K] with block scales -> [..., N]."""
    op = _pick(_fp8_linear_op, _fp8_linear_impl)
    return op(x, weight, scale, list(block), bias, pow2_scales, gated_input)


def _rms_norm_impl(x: Tensor, weight: Tensor, eps: float, weight_offset: float) -> Tensor:
    return norm.rms_norm(x, weight, eps, weight_offset=weight_offset)


def _rms_norm_residual_impl(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor, weight_offset: float
) -> tuple[Tensor, Tensor]:
    return norm.rms_norm(x, weight, eps, residual, weight_offset=weight_offset)


_rms_norm_op = _opaque("rms_norm", _rms_norm_impl, _like_x)
_rms_norm_residual_op = _opaque(
    "rms_norm_residual", _rms_norm_residual_impl, lambda x, *args: (_like_x(x), _like_x(x))
)


def rms_norm(
    x: Tensor, weight: Tensor, eps: float, residual: Tensor | None = None, *, weight_offset: float = 0.0
) -> Tensor | tuple[Tensor, Tensor]:
    """atom_kernels.rms_norm: x [T, H] -> out [T, H], or (out, x + residual) with a residual."""
    if residual is None:
        return _pick(_rms_norm_op, _rms_norm_impl)(x, weight, eps, weight_offset)
    return _pick(_rms_norm_residual_op, _rms_norm_residual_impl)(x, weight, eps, residual, weight_offset)


def _rms_norm_gated_impl(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    return norm.rms_norm_gated(x, gate, weight, eps)


_rms_norm_gated_op = _opaque("rms_norm_gated", _rms_norm_gated_impl, _like_x)


def rms_norm_gated(x: Tensor, gate: Tensor, weight: Tensor, eps: float) -> Tensor:
    """atom_kernels.rms_norm_gated: x, gate [N, D] -> [N, D]."""
    return _pick(_rms_norm_gated_op, _rms_norm_gated_impl)(x, gate, weight, eps)


def _silu_and_mul_impl(x: Tensor) -> Tensor:
    return activation.silu_and_mul(x)


_silu_and_mul_op = _opaque(
    "silu_and_mul", _silu_and_mul_impl, lambda x: x.new_empty((x.shape[0], x.shape[1] // 2))
)


def silu_and_mul(x: Tensor) -> Tensor:
    """atom_kernels.silu_and_mul: x [T, 2I] -> [T, I]."""
    return _pick(_silu_and_mul_op, _silu_and_mul_impl)(x)


def _apply_rotary_impl(
    positions: Tensor, q: Tensor, k: Tensor, inv_freq: Tensor, rotary_dim: int, scaling: float, neox: bool
) -> None:
    rotary.apply_rotary(positions, q, k, inv_freq, rotary_dim=rotary_dim, scaling=scaling, neox=neox)


_apply_rotary_op = _opaque("apply_rotary", _apply_rotary_impl, lambda *args: None, mutates=("q", "k"))


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
    _pick(_apply_rotary_op, _apply_rotary_impl)(positions, q, k, inv_freq, rotary_dim, scaling, neox)
    return q, k


def _apply_mrope_impl(
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


_apply_mrope_op = _opaque("apply_mrope", _apply_mrope_impl, lambda *args: None, mutates=("q", "k"))


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
    args = (positions, q, k, inv_freq, rotary_dim, list(section), interleaved, scaling, neox)
    _pick(_apply_mrope_op, _apply_mrope_impl)(*args)
    return q, k


def _topk_softmax_impl(
    logits: Tensor, top_k: int, renormalize: bool, round_to: torch.dtype
) -> tuple[Tensor, Tensor]:
    return moe.topk_softmax(logits, top_k, renormalize, round_to=round_to)


_topk_softmax_op = _opaque("topk_softmax", _topk_softmax_impl, _routing_fake)


def topk_softmax(
    logits: Tensor, top_k: int, renormalize: bool, *, round_to: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """atom_kernels.topk_softmax: logits [T, E] -> (weights [T, k] fp32, ids [T, k] int32)."""
    return _pick(_topk_softmax_op, _topk_softmax_impl)(logits, top_k, renormalize, round_to)


def _grouped_topk_impl(
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


_grouped_topk_op = _opaque("grouped_topk", _grouped_topk_impl, _routing_fake)


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
    args = (logits, top_k, num_groups, topk_groups, bias, scoring, renormalize, scaling)
    return _pick(_grouped_topk_op, _grouped_topk_impl)(*args)


def _fused_experts_impl(
    x: Tensor,
    w13: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    w13_scale: Tensor | None,
    w2_scale: Tensor | None,
    scale_block: list[int] | None,
) -> Tensor:
    scales = None
    if w13_scale is not None and w2_scale is not None and scale_block is not None:
        scales = ExpertScales(w13_scale, w2_scale, (scale_block[0], scale_block[1]))
    return moe.fused_experts(x, w13, w2, topk_weights, topk_ids, scales=scales)


_fused_experts_op = _opaque("fused_experts", _fused_experts_impl, _like_x)


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
    flat = (None, None, None) if scales is None else (scales.w13, scales.w2, list(scales.block))
    return _pick(_fused_experts_op, _fused_experts_impl)(x, w13, w2, topk_weights, topk_ids, *flat)


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
