"""Routing and the fused experts as opaque custom ops while a graph compiler traces them
(atom_kernels/custom_op.py says why; the experts' torch reference loops over data)."""

from __future__ import annotations

import torch

from atom_kernels import moe
from atom_kernels.custom_op import like_x, opaque, pick
from atom_kernels.moe import ExpertScales, SharedExpert
from atom_kernels.moe.expert_mlp import SILU, ExpertActivation, ExpertBiases
from atom_kernels.moe.mxfp4 import ExpertMxfp4

Tensor = torch.Tensor


def _routing_fake(logits: Tensor, top_k: int, *args) -> tuple[Tensor, Tensor]:
    rows = logits.shape[0]
    return (
        logits.new_empty((rows, top_k), dtype=torch.float32),
        logits.new_empty((rows, top_k), dtype=torch.int32),
    )


def _topk_softmax_impl(
    logits: Tensor, top_k: int, renormalize: bool, round_to: torch.dtype
) -> tuple[Tensor, Tensor]:
    return moe.topk_softmax(logits, top_k, renormalize, round_to=round_to)


_topk_softmax_op = opaque("topk_softmax", _topk_softmax_impl, _routing_fake)


def topk_softmax(
    logits: Tensor, top_k: int, renormalize: bool, *, round_to: torch.dtype = torch.float32
) -> tuple[Tensor, Tensor]:
    """atom_kernels.topk_softmax: logits [T, E] -> (weights [T, k] fp32, ids [T, k] int32)."""
    return pick(_topk_softmax_op, _topk_softmax_impl)(logits, top_k, renormalize, round_to)


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
        logits, top_k, num_groups=num_groups, topk_groups=topk_groups, bias=bias, scoring=scoring,
        renormalize=renormalize, scaling=scaling,
    )  # fmt: skip


_grouped_topk_op = opaque("grouped_topk", _grouped_topk_impl, _routing_fake)


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
    return pick(_grouped_topk_op, _grouped_topk_impl)(*args)


def _fused_experts_impl(
    x: Tensor,
    w13: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    w13_scale: Tensor | None,
    w2_scale: Tensor | None,
    scale_block: list[int] | None,
    shared_out: Tensor | None,
    shared_gate: Tensor | None,
    activation: str = "silu",
    alpha: float = SILU.alpha,
    limit: float = SILU.limit,
    w13_bias: Tensor | None = None,
    w2_bias: Tensor | None = None,
    w13_mxfp4_scale: Tensor | None = None,
    w2_mxfp4_scale: Tensor | None = None,
) -> Tensor:
    scales = None
    if w13_scale is not None and w2_scale is not None and scale_block is not None:
        scales = ExpertScales(w13_scale, w2_scale, (scale_block[0], scale_block[1]))
    shared = None if shared_out is None else SharedExpert(shared_out, shared_gate)
    biases = None if w13_bias is None or w2_bias is None else ExpertBiases(w13_bias, w2_bias)
    act = ExpertActivation(activation, alpha, limit)
    mxfp4 = None
    if w13_mxfp4_scale is not None and w2_mxfp4_scale is not None:
        mxfp4 = ExpertMxfp4(w13_mxfp4_scale, w2_mxfp4_scale)
    return moe.fused_experts(
        x, w13, w2, topk_weights, topk_ids, scales=scales, shared=shared, activation=act, biases=biases,
        mxfp4=mxfp4,
    )  # fmt: skip


_fused_experts_op = opaque("fused_experts", _fused_experts_impl, like_x)


def fused_experts(
    x: Tensor,
    w13: Tensor,
    w2: Tensor,
    topk_weights: Tensor,
    topk_ids: Tensor,
    *,
    scales: ExpertScales | None = None,
    shared: SharedExpert | None = None,
    activation: ExpertActivation = SILU,
    biases: ExpertBiases | None = None,
    mxfp4: ExpertMxfp4 | None = None,
) -> Tensor:
    """atom_kernels.fused_experts: x [T, H], experts w13 [E, 2I, H], w2 [E, H, I], routing [T, k] -> [T, H]
    (plus the shared expert's term, if given; activation, biases and MXFP4 weights as there)."""
    flat = (None, None, None) if scales is None else (scales.w13, scales.w2, list(scales.block))
    term = (None, None) if shared is None else (shared.out, shared.gate)
    act = (activation.kind, activation.alpha, activation.limit)
    bias = (None, None) if biases is None else (biases.w13, biases.w2)
    fp4 = (None, None) if mxfp4 is None else (mxfp4.w13, mxfp4.w2)
    return pick(_fused_experts_op, _fused_experts_impl)(
        x, w13, w2, topk_weights, topk_ids, *flat, *term, *act, *bias, *fp4
    )
