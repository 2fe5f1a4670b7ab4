"""fused_experts: the expert half of a MoE layer (after routing), as two grouped GEMMs and a combine."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from atom_kernels.fp8.act_quant import quantize_act
from atom_kernels.fp8.ref import E4M3, dequantize_weight_ref, scale_grid
from atom_kernels.moe.align import order_by_expert, order_one_token
from atom_kernels.moe.combine import combine_topk
from atom_kernels.moe.expert_gemm import MXFP4, TileConfig, down, down_tile_config, gate_up, tile_config
from atom_kernels.moe.expert_mlp import SILU, ExpertActivation, ExpertBiases
from atom_kernels.moe.mxfp4 import ExpertMxfp4
from atom_kernels.moe.mxfp4_gemv import gemv_config, gemv_takes, mxfp4_gemv_experts
from atom_kernels.moe.ref import fused_experts_ref
from atom_kernels.moe.shared import SharedExpert
from atom_kernels.outputs import rows_like
from atom_kernels.settings import SETTINGS, Backend, resolve_backend


def _experts_static(
    x,
    w13,
    w2,
    topk_weights,
    topk_ids,
    activation: ExpertActivation = SILU,
    biases: ExpertBiases | None = None,
) -> torch.Tensor:
    """The experts with shapes fixed by x alone (no host sync), for CUDA-graph capture on the torch backend.

    Few (token, expert) pairs gather their experts' weights; otherwise every expert runs on every token,
    weighted by a dense [T, E] routing matrix (zero where not chosen).
    """
    tokens, k = topk_ids.shape
    experts, inter = w13.shape[0], w2.shape[2]
    ids = topk_ids.long()
    weights = topk_weights.to(x.dtype)
    b13 = b2 = None
    if biases is not None:
        b13, b2 = biases.w13.to(x.dtype), biases.w2.to(x.dtype)
    if tokens * k < experts:
        h = torch.einsum("tkoh,th->tko", w13[ids], x)
        if b13 is not None:
            h = h + b13[ids]
        h = activation.ref(h[..., :inter], h[..., inter:])
        y = torch.einsum("tkhi,tki->tkh", w2[ids], h)
        if b2 is not None:
            y = y + b2[ids]
        return (y * weights[..., None]).sum(1)
    dense = torch.zeros(tokens, experts, dtype=x.dtype, device=x.device).scatter_(1, ids, weights)
    # summed in fp32 and rounded once, as the kernels do (a running sum in x's dtype rounds E times)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for e in range(experts):
        h = F.linear(x, w13[e], None if b13 is None else b13[e])
        y = F.linear(activation.ref(h[:, :inter], h[:, inter:]), w2[e], None if b2 is None else b2[e])
        out += y * dense[:, e, None]
    return out.to(x.dtype)


# One token's experts run weight-only below this many elements an expert (3 * hidden * inter): there the
# two extra quantize launches cost more than the conversion W8A8 saves (bench_moe_fp8.py: weight-only ahead
# for Qwen3-30B-A3B's 4.7M, W8A8 for DeepSeek-V3's 44M)
ONE_TOKEN_W8A8_MIN_ELEMENTS = 32 << 20
# Rows per expert past which fused_experts takes its tall tiles, where the W8A8 step's scaled product
# (not accumulated in the MMA) runs slower than weight-only (0.41-0.44x bf16 against 0.64-0.69x at 4096)
W8A8_MAX_ROWS_PER_EXPERT = 96


def _w8a8_block_k(block_k: int) -> bool:
    """The W8A8 expert kernels' k-step is one scale group and at least the fp8 MMA's depth."""
    return block_k >= 32 and block_k & (block_k - 1) == 0


def experts_quantize_input(
    block: tuple[int, int], tokens: int, top_k: int, experts: int, hidden: int, inter: int
) -> bool:
    """Whether fused_experts' kernels run e4m3 experts W8A8 (x and the intermediate quantized per row and
    block_k group) or weight-only: W8A8 needs block_k a power of two >= 32 (the fp8 MMA's depth) dividing
    hidden and inter (whole groups: a tensor-parallel shard that cuts the checkpoint's blocks gets a finer
    grid, whose activation groups could not be the unsharded model's, so such models stay weight-only at
    every size), and is taken where it was faster (bench_moe_fp8.py): up to
    W8A8_MAX_ROWS_PER_EXPERT rows an expert, and for a single token only with large experts."""
    bk = block[1]
    if not _w8a8_block_k(bk) or hidden % bk or inter % bk:
        return False
    if tokens * top_k > W8A8_MAX_ROWS_PER_EXPERT * experts:
        return False
    return tokens > 1 or 3 * hidden * inter >= ONE_TOKEN_W8A8_MIN_ELEMENTS


def mxfp4_tile_config(cfg: TileConfig, *, one_token: bool = False, interpret: bool = False) -> TileConfig:
    """The bf16 tile for the rows an expert gets, fitted to MXFP4's upcast. Decode's 16-row tiles keep 4
    warps and 3 stages, 32 x 256 for one token (where a down_config asks for the tile kernels instead of
    the GEMVs) and 64 x 128 past it (benchmarks/sweep_moe_mxfp4.py chose them over 8-warp tiles at
    gpt-oss-120b's experts, though the compiler reports a spill at 64 x 128).
    Taller tiles hold two upcast weight tiles beside the gate/up GEMM's two accumulators: 8 warps, at
    most 64 columns, and 128-row tiles k-steps of 32 (compile_moe_mxfp4_sm90.py: these do not spill)."""
    if cfg.block_m <= 16 and not interpret:
        wide = not one_token
        return TileConfig(16, 64 if wide else 32, 128 if wide else 256, cfg.group_m, 4, 3)
    block_k = min(cfg.block_k, 32) if cfg.block_m >= 128 else cfg.block_k
    return TileConfig(cfg.block_m, min(cfg.block_n, 64), block_k, cfg.group_m, 8, cfg.num_stages)


def dequantize_experts(w: torch.Tensor, scale: torch.Tensor, block: tuple[int, int], dtype) -> torch.Tensor:
    """e4m3 expert weights [E, N, K] with scales [E, N_blocks, K_blocks] -> [E, N, K] in dtype."""
    return torch.stack([dequantize_weight_ref(w[e], scale[e], block, dtype) for e in range(w.shape[0])])


def _experts_torch(x, w13, w2, topk_weights, topk_ids, scales, activation, biases, mxfp4) -> torch.Tensor:
    """The torch backend: the reference (only the experts hit run: a host sync), or the static form
    while a CUDA graph is being captured. e4m3 experts are dequantized first (weight-only)."""
    if scales is not None:
        w13 = dequantize_experts(w13, scales.w13, scales.block, x.dtype)
        w2 = dequantize_experts(w2, scales.w2, scales.block, x.dtype)
    if mxfp4 is not None:
        w13, w2 = mxfp4.dequantize(w13, w2, x.dtype)
    if x.is_cuda and torch.cuda.is_current_stream_capturing():
        return _experts_static(x, w13, w2, topk_weights, topk_ids, activation, biases)
    return fused_experts_ref(x, w13, w2, topk_weights, topk_ids, activation, biases)


@dataclass(frozen=True, slots=True)
class ExpertScales:
    """Block scales of e4m3 expert weights: w13 [E, ceil(2I/bn), ceil(H/bk)], w2 [E, ceil(H/bn),
    ceil(I/bk)] fp32, block (bn, bk). bn must divide I (gate and up have their own scale rows) and bk
    be a power of two of at least 16 (the kernels' k-step divides it)."""

    w13: torch.Tensor
    w2: torch.Tensor
    block: tuple[int, int]

    def check(self, w13: torch.Tensor, w2: torch.Tensor) -> None:
        bn, bk = self.block
        inter = w2.shape[2]
        if w13.dtype != E4M3 or w2.dtype != E4M3:
            raise ValueError(f"expert scales go with float8_e4m3fn weights, got {w13.dtype} and {w2.dtype}")
        if inter % bn or bk < 16 or bk & (bk - 1):
            raise ValueError(
                f"expert scale block {self.block}: block_n must divide the intermediate size {inter} and "
                "block_k be a power of two >= 16"
            )
        for name, w, s in (("w13", w13, self.w13), ("w2", w2, self.w2)):
            want = (w.shape[0], *scale_grid(tuple(w.shape[1:]), self.block))
            if tuple(s.shape) != want or s.dtype != torch.float32 or not s.is_contiguous():
                raise ValueError(
                    f"{name} scales must be contiguous float32 {want} for {tuple(w.shape)} in {self.block} "
                    f"blocks, got {s.dtype} {tuple(s.shape)}"
                )


def _check(x, w13, w2, topk_weights, topk_ids, scales, biases, mxfp4) -> None:
    if x.dim() != 2 or w13.dim() != 3 or w2.dim() != 3:
        raise ValueError(
            f"fused_experts expects x [T, H], w13 [E, 2I, H], w2 [E, H, I]; got {tuple(x.shape)}, "
            f"{tuple(w13.shape)}, {tuple(w2.shape)}"
        )
    if scales is not None and mxfp4 is not None:
        raise ValueError("expert weights are e4m3 (scales) or MXFP4 (mxfp4), not both")
    packing = 2 if mxfp4 is not None else 1  # MXFP4 rows hold two values a byte
    experts, two_inter, hidden = w13.shape[0], w13.shape[1], w13.shape[2] * packing
    if two_inter % 2 or hidden != x.shape[1] or w2.shape != (experts, hidden, two_inter // 2 // packing):
        raise ValueError(
            f"expert weights do not fit x [T, {x.shape[1]}]: w13 {tuple(w13.shape)} must be [E, 2I, H] "
            f"and w2 {tuple(w2.shape)} must be [E, H, I]"
            + (" (H and I halved: MXFP4 bytes)" if packing > 1 else "")
        )
    if topk_ids.dim() != 2 or topk_ids.shape[0] != x.shape[0] or topk_weights.shape != topk_ids.shape:
        raise ValueError(
            f"topk_weights {tuple(topk_weights.shape)} and topk_ids {tuple(topk_ids.shape)} must both be "
            f"[T={x.shape[0]}, k]"
        )
    if biases is not None:
        biases.check(experts, two_inter // 2, hidden)
    if scales is not None:
        scales.check(w13, w2)
    elif mxfp4 is not None:
        mxfp4.check(w13, w2)
    elif w13.dtype != x.dtype or w2.dtype != x.dtype:
        raise ValueError(f"expert weights must be {x.dtype} like x, got {w13.dtype} and {w2.dtype}")
    if x.stride(-1) != 1 or w13.stride(-1) != 1 or w2.stride(-1) != 1:
        raise ValueError("fused_experts needs the last dimension of x, w13 and w2 contiguous")


def fused_experts(
    x: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk_weights: torch.Tensor,
    topk_ids: torch.Tensor,
    *,
    out: torch.Tensor | None = None,
    config: TileConfig | None = None,
    down_config: TileConfig | None = None,
    scales: ExpertScales | None = None,
    quantize_input: bool | None = None,
    shared: SharedExpert | None = None,
    activation: ExpertActivation = SILU,
    biases: ExpertBiases | None = None,
    mxfp4: ExpertMxfp4 | None = None,
    backend: Backend | str | None = None,
) -> torch.Tensor:
    """out[t] = sum_j weights[t, j] * W2[e] @ (silu(W1[e] @ x[t]) * (W3[e] @ x[t])), e = ids[t, j], plus
    the block's shared expert's term (shared.SharedExpert: its output, scaled by its gate's sigmoid).
    activation: how gate and up combine (expert_mlp.ExpertActivation; GPT-OSS's swiglu_oai);
    biases: added after each expert matmul (expert_mlp.ExpertBiases: w13 [E, 2I], w2 [E, H]).
    mxfp4: w13 [E, 2I, H / 2] and w2 [E, H, I / 2] are MXFP4 bytes with these e8m0 scales (mxfp4.py); the
    kernels dequantize each tile as they load it (weight-only; one token, or few pairs for the experts,
    as GEMVs: mxfp4_gemv.py), the torch backend dequantizes first.

    x: [T, H] bf16/fp16/fp32; w13: [E, 2I, H] (gate rows, then up rows); w2: [E, H, I];
    topk_weights: [T, k] (any float dtype); topk_ids: [T, k] int in [0, E). out: [T, H] like x.
    With scales, w13 and w2 are e4m3 with block scales (ExpertScales). The Triton kernels then run W8A8
    where experts_quantize_input says so (x, and silu(gate) * up before the down GEMM, quantized
    per row and block_k group as quantize_act does, as the checkpoints' dynamic activation scheme says;
    e4m3 tiles into the MMA), else weight-only (each weight tile dequantized as it is loaded); the torch
    backend computes weight-only on dequantized weights. quantize_input=False keeps the Triton kernels
    weight-only and True makes them W8A8 whatever the shape (benchmarks, tests; refused where block_k does
    not allow it).
    config overrides the tile shape of both GEMMs, down_config the down GEMM's alone (same block_m;
    benchmark sweeps). The Triton path has no host sync and can be
    captured in a CUDA graph. Returns out.
    """
    _check(x, w13, w2, topk_weights, topk_ids, scales, biases, mxfp4)
    tokens, hidden = x.shape
    if shared is not None:
        shared.check(tokens, hidden)
    out = rows_like(x, out)
    if resolve_backend(backend, x.device) is Backend.TORCH:
        routed = _experts_torch(x, w13, w2, topk_weights, topk_ids, scales, activation, biases, mxfp4)
        return out.copy_(routed if shared is None else routed.float() + shared.term())
    if tokens == 0:
        return out
    top_k, experts = topk_ids.shape[1], w13.shape[0]
    if mxfp4 is not None and quantize_input:
        raise ValueError("MXFP4 experts run weight-only (quantize_input must not be True)")
    # (a tile given for either GEMM asks for the tile kernels: benchmark sweeps, tests)
    if mxfp4 is not None and config is None and down_config is None and gemv_takes(tokens, top_k, experts):
        y = mxfp4_gemv_experts(
            x, w13, w2, topk_ids, topk_weights.reshape(-1).float(), mxfp4,
            gemv_config(interpret=SETTINGS.triton_interpret), biases=biases, activation=activation,
        )  # fmt: skip
        return combine_topk(y, top_k, out, shared)
    cfg = config or tile_config(
        tokens * top_k, experts, x.element_size(), interpret=SETTINGS.triton_interpret, one_token=tokens == 1
    )
    # One token needs no ordering kernel: its k experts are distinct, one tile each.
    order = (
        order_one_token(topk_ids, cfg.block_m)
        if tokens == 1
        else order_by_expert(topk_ids, experts, cfg.block_m)
    )
    if mxfp4 is not None and config is None:
        cfg = mxfp4_tile_config(cfg, one_token=tokens == 1, interpret=SETTINGS.triton_interpret)
    down_cfg = down_config or (cfg if mxfp4 is not None else down_tile_config(cfg))
    if down_cfg.block_m != cfg.block_m:
        raise ValueError(f"down_config.block_m={down_cfg.block_m} must equal the ordering's {cfg.block_m}")
    pair_weights = topk_weights.reshape(-1).float()
    inter = w13.shape[1] // 2
    allowed = scales is not None and _w8a8_block_k(scales.block[1])
    if mxfp4 is not None:
        epi13 = dict(bias=None if biases is None else biases.w13, activation=activation)
        h = gate_up(x, w13, order, top_k, cfg, (mxfp4.w13, MXFP4), **epi13)
        y = down(
            h,
            w2,
            order,
            pair_weights,
            down_cfg,
            (mxfp4.w2, MXFP4),
            bias=None if biases is None else biases.w2,
        )
        return combine_topk(y, top_k, out, shared)
    if quantize_input and not allowed:
        raise ValueError(
            f"fused_experts runs W8A8 with e4m3 experts whose block_k is a power of two >= 32; got "
            f"{'no scales' if scales is None else f'block {scales.block}'}"
        )
    if quantize_input is None:
        quantize_input = allowed and experts_quantize_input(
            scales.block, tokens, top_k, experts, hidden, inter
        )
    epi13 = dict(bias=None if biases is None else biases.w13, activation=activation)
    epi2 = dict(bias=None if biases is None else biases.w2)
    if quantize_input:
        bk = scales.block[1]
        xq, xs = quantize_act(x, bk, backend=Backend.TRITON)
        h = gate_up(
            xq, w13, order, top_k, cfg, (scales.w13, scales.block), x_scale=xs, out_dtype=x.dtype, **epi13
        )
        hq, hs = quantize_act(h, bk, backend=Backend.TRITON)  # padded rows too: the down GEMM masks them
        y = down(
            hq, w2, order, pair_weights, down_cfg, (scales.w2, scales.block), h_scale=hs, out_dtype=x.dtype,
            **epi2,
        )  # fmt: skip
    else:
        h = gate_up(x, w13, order, top_k, cfg, scales and (scales.w13, scales.block), **epi13)
        y = down(h, w2, order, pair_weights, down_cfg, scales and (scales.w2, scales.block), **epi2)
    return combine_topk(y, top_k, out, shared)
