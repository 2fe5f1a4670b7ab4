"""fp8_linear: y = x @ W^T + bias for a block-scaled e4m3 weight, the kernel chosen by row count."""

from __future__ import annotations

import torch

from atom_kernels.activation import silu_and_mul
from atom_kernels.activation.ref import silu_and_mul_ref
from atom_kernels.fp8.act_quant import quantize_act
from atom_kernels.fp8.cublas_blockwise import cublas_blockwise_supported, cublas_w8a8
from atom_kernels.fp8.gemm import w8a8_gemm
from atom_kernels.fp8.ref import E4M3, fp8_linear_ref, scale_grid
from atom_kernels.fp8.skinny_w8a8 import MAX_ROWS as SKINNY_W8A8_MAX_ROWS
from atom_kernels.fp8.skinny_w8a8 import w8a8_skinny
from atom_kernels.fp8.stream import MAX_SKINNY_ROWS, run_stream
from atom_kernels.settings import Backend, resolve_backend

_X_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
# One row of a weight smaller than this streams weight-only (the GEMV): there quantizing x, a launch of its
# own, costs more than the W8A8 kernel saves (sweep_fp8_skinny.py: the GEMV ahead on the smaller weights,
# W8A8 on most of the larger ones)
GEMV_MAX_ELEMENTS = 32 << 20


def quantizes_input(rows: int, n: int, k: int, block_k: int) -> bool:
    """Whether fp8_linear's kernels quantize x (W8A8) for this shape, or stream the weight with x as it is
    (weight-only): W8A8 needs block_k a power of two >= 16, and one row of a small weight streams."""
    if block_k < 16 or block_k & (block_k - 1):
        return False
    return rows > 1 or n * k >= GEMV_MAX_ELEMENTS


def _check(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None,
    gated_input: bool = False,
) -> None:
    if weight.dim() != 2:
        raise ValueError(f"fp8_linear expects weight [N, K], got shape {tuple(weight.shape)}")
    if weight.dtype != E4M3:
        raise ValueError(f"fp8_linear expects a {E4M3} weight, got {weight.dtype}")
    if len(block) != 2 or min(block) < 1:
        raise ValueError(f"fp8_linear expects block (block_n, block_k) of positive sizes, got {block}")
    n, k = weight.shape
    if x.shape[-1] != (2 * k if gated_input else k):
        what = f"[..., 2K] (gate then up) with 2K={2 * k}" if gated_input else f"[..., K] with K={k}"
        raise ValueError(
            f"fp8_linear expects x {what} from weight {tuple(weight.shape)}, got x of shape {tuple(x.shape)}"
        )
    if x.dtype not in _X_DTYPES:
        raise ValueError(f"fp8_linear expects x in float16, bfloat16 or float32, got {x.dtype}")
    grid = scale_grid((n, k), block)
    if tuple(scale.shape) != grid:
        raise ValueError(
            f"fp8_linear expects scale {list(grid)} (ceil(N/{block[0]}), ceil(K/{block[1]})) for weight "
            f"{tuple(weight.shape)}, got {tuple(scale.shape)}"
        )
    if scale.dtype != torch.float32:
        raise ValueError(f"fp8_linear expects a float32 scale (convert it at load time), got {scale.dtype}")
    if bias is not None and tuple(bias.shape) != (n,):
        raise ValueError(f"fp8_linear expects bias [{n}], got {tuple(bias.shape)}")


def fp8_linear(
    x: torch.Tensor,
    weight: torch.Tensor,
    scale: torch.Tensor,
    block: tuple[int, int],
    bias: torch.Tensor | None = None,
    *,
    pow2_scales: bool = False,
    backend: Backend | str | None = None,
    gated_input: bool = False,
) -> torch.Tensor:
    """x @ dequant(weight)^T + bias -> [..., N] in x's dtype.

    x: [..., K] fp16/bf16/fp32, or [..., 2K] (gate | up) with gated_input, whose input is then
    silu(gate) * up in x's dtype (formed inside x's quantization on the W8A8 paths); weight: [N, K]
    float8_e4m3fn; scale: [ceil(N/bn), ceil(K/bk)] float32 with block = (bn, bk),
    W ~= weight * scale[n // bn, k // bk]; bias: [N] or None.
    Paths (quantizes_input): x is quantized per token and bk group (pow2_scales: power-of-two activation
    scales), as the checkpoints' dynamic activation scheme says, and e4m3 tiles go to the tensor cores:
    the operand-swapped skinny kernel at 2..64 rows and for one row of a large weight; beyond 64 rows
    cuBLAS's blockwise-scaled GEMM where it runs the format (Hopper, 128x128 blocks, bf16/fp16 x), else
    the Triton W8A8 GEMM. One row of a small weight, and any block_k that is not a power of two >= 16 at
    <= 16 rows, stream the weight with x unquantized (weight-only). Beyond 16 rows bk must be a power of
    two >= 16. The kernels run on a GPU, or on the CPU interpreter when backend="triton" is passed; the
    torch backend computes the weight-only product with the weight dequantized (fp8_linear_ref).
    """
    _check(x, weight, scale, block, bias, gated_input)
    n, k = weight.shape
    bk = block[1]
    chosen = resolve_backend(backend, x.device)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, x.shape[-1])
    rows = x2.shape[0]
    if rows == 0:
        return x.new_empty(*lead, n)
    use_kernel = (
        chosen is not Backend.TORCH
        and (x.is_cuda or backend is not None)  # on the CPU the interpreter is a test path, not a fast one
        and weight.stride(-1) == 1
        and scale.stride(-1) == 1
    )
    if not use_kernel:
        x2 = silu_and_mul_ref(x2) if gated_input else x2
        return fp8_linear_ref(x2, weight, scale, block, bias).view(*lead, n)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if rows <= MAX_SKINNY_ROWS and not quantizes_input(rows, n, k, bk):
        x2 = silu_and_mul(x2, backend=chosen) if gated_input else x2  # weight-only: x in its dtype
        y = torch.empty(rows, n, dtype=x.dtype, device=x.device)
        run_stream(x2, weight, scale, block, bias, y)
        return y.view(*lead, n)
    if bk < 16 or bk & (bk - 1):
        raise ValueError(
            f"fp8_linear's W8A8 kernels ({rows} rows > {MAX_SKINNY_ROWS}) need block_k a power of two >= 16, "
            f"got block_k={bk}"
        )
    if (
        rows > SKINNY_W8A8_MAX_ROWS
        and x2.is_cuda
        and weight.is_contiguous()
        and scale.is_contiguous()
        and cublas_blockwise_supported(n, k, block, x.dtype, x.device)
    ):
        y = cublas_w8a8(x2, weight, scale, bias, pow2_scales=pow2_scales, gated_input=gated_input)
        return y.view(*lead, n)
    xq, xs = quantize_act(x2, bk, pow2_scales=pow2_scales, backend=chosen, gated_input=gated_input)
    if rows <= SKINNY_W8A8_MAX_ROWS:
        return w8a8_skinny(xq, xs, weight, scale, block, bias, out_dtype=x.dtype).view(*lead, n)
    return w8a8_gemm(xq, xs, weight, scale, block, bias, out_dtype=x.dtype).view(*lead, n)
