"""Top-k expert routing in one launch per batch: softmax top-k, and DeepSeek-V3's grouped top-k.

One program per token holds that token's E router logits in registers and takes the k best by repeated
argmax (k <= 16 in every model we serve, so this beats a sort). Ties go to the lower expert id.
A program is one warp (up to 512 experts): its 2k + 3 reductions then need no shared memory or barrier.
In CUDA-graph replays (benchmarks/sweep_small_kernels.py, results/h200/archive/small_kernels.log) one warp beat
four at one token (E=128, and grouped at E=256) and by more at 4096 tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.moe.grouping import GroupedRouting
from atom_kernels.moe.ref import grouped_topk_ref, topk_softmax_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend


@triton.jit
def _round_to_bf16(x):
    """fp32 -> the nearest bf16 (ties to even), kept in fp32: by the bits, so that the CPU interpreter
    (whose bf16 cast truncates) rounds as the GPU does. x is finite."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + 0x7FFF + ((bits >> 16) & 1)
    return ((bits >> 16) << 16).to(tl.float32, bitcast=True)


@triton.jit
def _topk_softmax_kernel(
    logits_ptr,
    weights_ptr,
    ids_ptr,
    experts,
    stride_l,
    TOP_K: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    ROUND_TO: tl.constexpr,
    BLOCK_E: tl.constexpr,
    BLOCK_K: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    wait_for_inputs(PDL)
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK_E)
    x = tl.load(logits_ptr + row * stride_l + offs, mask=offs < experts, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, axis=0))
    p = p / tl.sum(p, axis=0)
    slot = tl.arange(0, BLOCK_K)
    w = tl.zeros([BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        best = tl.max(p, axis=0)
        idx = tl.min(tl.where(p == best, offs, BLOCK_E), axis=0)
        w = tl.where(slot == j, best, w)
        ids = tl.where(slot == j, idx, ids)
        p = tl.where(offs == idx, -1.0, p)  # probabilities are >= 0: -1 is never chosen again
    if RENORMALIZE:
        w = w / tl.sum(w, axis=0)
    if ROUND_TO == 1:  # fp32 storage, the caller's rounding
        w = _round_to_bf16(w)
    elif ROUND_TO == 2:
        w = w.to(tl.float16).to(tl.float32)
    tl.store(weights_ptr + row * TOP_K + slot, w, mask=slot < TOP_K)
    tl.store(ids_ptr + row * TOP_K + slot, ids, mask=slot < TOP_K)


@triton.jit
def _grouped_topk_kernel(
    logits_ptr,
    bias_ptr,
    weights_ptr,
    ids_ptr,
    stride_l,
    scaling,
    GROUPS: tl.constexpr,
    GROUP_SIZE: tl.constexpr,
    TOPK_GROUPS: tl.constexpr,
    TOP_K: tl.constexpr,
    BLOCK_K: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    SIGMOID: tl.constexpr,
    RENORMALIZE: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    wait_for_inputs(PDL)  # the bias is a constant, but a register load ahead of it saves nothing
    row = tl.program_id(0).to(tl.int64)
    g = tl.arange(0, GROUPS)
    offs = g[:, None] * GROUP_SIZE + tl.arange(0, GROUP_SIZE)[None, :]  # [G, S]: expert ids
    x = tl.load(logits_ptr + row * stride_l + offs).to(tl.float32)
    if SIGMOID:
        scores = 1.0 / (1.0 + tl.exp(-x))
    else:
        e = tl.exp(x - tl.max(tl.max(x, axis=1), axis=0))
        scores = e / tl.sum(tl.sum(e, axis=1), axis=0)
    choice = scores
    if HAS_BIAS:
        choice = scores + tl.load(bias_ptr + offs).to(tl.float32)
        best = tl.max(choice, axis=1)
        first = tl.min(tl.where(choice == best[:, None], offs, GROUPS * GROUP_SIZE), axis=1)
        second = tl.max(tl.where(offs == first[:, None], float("-inf"), choice), axis=1)
        group_score = best + second
    else:
        group_score = tl.max(choice, axis=1)
    keep = g < 0  # all False
    for _ in tl.static_range(TOPK_GROUPS):
        top = tl.max(group_score, axis=0)
        pick = tl.min(tl.where(group_score == top, g, GROUPS), axis=0)
        keep = keep | (g == pick)
        group_score = tl.where(g == pick, float("-inf"), group_score)
    choice = tl.where(keep[:, None], choice, float("-inf"))
    slot = tl.arange(0, BLOCK_K)
    w = tl.zeros([BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):
        top = tl.max(tl.max(choice, axis=1), axis=0)
        idx = tl.min(tl.min(tl.where(choice == top, offs, GROUPS * GROUP_SIZE), axis=1), axis=0)
        score = tl.sum(tl.sum(tl.where(offs == idx, scores, 0.0), axis=1), axis=0)
        w = tl.where(slot == j, score, w)
        ids = tl.where(slot == j, idx, ids)
        choice = tl.where(offs == idx, float("-inf"), choice)
    if RENORMALIZE:
        w = w / tl.sum(w, axis=0)
    tl.store(weights_ptr + row * TOP_K + slot, w * scaling, mask=slot < TOP_K)
    tl.store(ids_ptr + row * TOP_K + slot, ids, mask=slot < TOP_K)


_ROUNDINGS = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # the kernel's ROUND_TO


def _warps(experts: int) -> int:
    """One warp up to 512 experts (16 logits a lane), more past it."""
    return max(1, triton.next_power_of_2(experts) // 512)


def _outputs(tokens: int, top_k: int, device, weights, ids):
    if weights is None:
        weights = torch.empty(tokens, top_k, dtype=torch.float32, device=device)
    if ids is None:
        ids = torch.empty(tokens, top_k, dtype=torch.int32, device=device)
    for name, t, dtype in (("weights", weights, torch.float32), ("ids", ids, torch.int32)):
        if t.shape != (tokens, top_k) or t.dtype != dtype or not t.is_contiguous():
            raise ValueError(f"{name} must be a contiguous [{tokens}, {top_k}] {dtype} tensor")
    return weights, ids


def _check_logits(logits: torch.Tensor, top_k: int) -> None:
    if logits.dim() != 2 or logits.stride(-1) != 1:
        raise ValueError(
            f"router logits must be [T, E] with a contiguous last dim, got {tuple(logits.shape)}"
        )
    if not 1 <= top_k <= logits.shape[1]:
        raise ValueError(f"top_k={top_k} must be between 1 and the number of experts ({logits.shape[1]})")


def topk_softmax(
    logits: torch.Tensor,
    top_k: int,
    renormalize: bool,
    *,
    round_to: torch.dtype = torch.float32,
    weights: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax over E router logits, then the k most probable experts (Mixtral, Qwen-MoE).

    logits: [T, E], any float dtype. renormalize: scale the k weights to sum 1 (norm_topk_prob).
    round_to: each weight rounded through this dtype (bf16, fp16 or fp32) and kept in fp32, what a model
    that casts its routing weights to its activations' dtype gets, without a conversion launch after
    this one, nor one back to fp32 in fused_experts.
    Returns (weights [T, k] fp32, ids [T, k] int32), into the given tensors if passed.
    """
    _check_logits(logits, top_k)
    if round_to not in _ROUNDINGS:
        raise ValueError(f"round_to must be one of {list(_ROUNDINGS)}, got {round_to}")
    weights, ids = _outputs(logits.shape[0], top_k, logits.device, weights, ids)
    if resolve_backend(backend, logits.device) is Backend.TORCH:
        ref_w, ref_ids = topk_softmax_ref(logits, top_k, renormalize)
        return weights.copy_(ref_w.to(round_to)), ids.copy_(ref_ids)
    if logits.shape[0]:
        pdl = pdl_launch(logits.device)
        _topk_softmax_kernel[(logits.shape[0],)](
            logits, weights, ids, logits.shape[1], logits.stride(0), TOP_K=top_k, RENORMALIZE=renormalize,
            ROUND_TO=_ROUNDINGS[round_to], BLOCK_E=triton.next_power_of_2(logits.shape[1]),
            BLOCK_K=triton.next_power_of_2(top_k), PDL=pdl, num_warps=_warps(logits.shape[1]), launch_pdl=pdl,
        )  # fmt: skip
    return weights, ids


def grouped_topk(
    logits: torch.Tensor,
    top_k: int,
    *,
    num_groups: int,
    topk_groups: int,
    bias: torch.Tensor | None = None,
    scoring: str = "sigmoid",
    renormalize: bool = True,
    scaling: float = 1.0,
    weights: torch.Tensor | None = None,
    ids: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DeepSeek-V3 routing (see `grouped_topk_ref`): expert groups first, then experts within them.

    logits: [T, E] with E = num_groups * group size (both powers of two for Triton); bias: [E] or None;
    scoring: "sigmoid" (DeepSeek-V3) or "softmax" (DeepSeek-V2). Experts outside the kept groups are
    never chosen. Returns (weights [T, k] fp32, ids [T, k] int32).
    """
    _check_logits(logits, top_k)
    experts = logits.shape[1]
    routing = GroupedRouting(num_groups, topk_groups, scoring, renormalize, scaling)
    routing.check(experts, top_k, bias)
    group_size = experts // num_groups
    weights, ids = _outputs(logits.shape[0], top_k, logits.device, weights, ids)
    if resolve_backend(backend, logits.device) is Backend.TORCH:
        ref_w, ref_ids = grouped_topk_ref(logits, top_k, routing, bias)
        return weights.copy_(ref_w), ids.copy_(ref_ids)
    pow2 = triton.next_power_of_2
    if pow2(num_groups) != num_groups or pow2(group_size) != group_size:
        raise ValueError(
            f"the Triton grouped_topk needs a power-of-two number of groups ({num_groups}) and group size "
            f"({group_size}); use backend='torch' for this shape"
        )
    if logits.shape[0]:
        pdl = pdl_launch(logits.device)
        _grouped_topk_kernel[(logits.shape[0],)](
            logits, bias if bias is not None else logits, weights, ids, logits.stride(0), scaling,
            GROUPS=num_groups, GROUP_SIZE=group_size, TOPK_GROUPS=topk_groups, TOP_K=top_k,
            BLOCK_K=pow2(top_k), HAS_BIAS=bias is not None, SIGMOID=scoring == "sigmoid",
            RENORMALIZE=renormalize, PDL=pdl, num_warps=_warps(experts), launch_pdl=pdl,
        )  # fmt: skip
    return weights, ids
