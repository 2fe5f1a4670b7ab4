"""fp8 quantization of KV tiles inside the cache-write kernels."""

import triton
import triton.language as tl


@triton.jit
def quantize_fp8(
    x, absmax, scale_ptr, scale_off, scale_mask, SCALE_KIND: tl.constexpr, FP8_MAX: tl.constexpr
):
    """x (fp32, any tile) -> x / scale, clamped to the fp8 range. SCALE_KIND 1: one per-tensor scale, read;
    2: per token and head, absmax / FP8_MAX from `absmax` (x's absolute maximum over each token-head's
    dims, broadcastable to x), stored at scale_off (same shape as absmax)."""
    if SCALE_KIND == 2:
        scale = tl.where(absmax > 0, absmax / FP8_MAX, 1.0)
        tl.store(scale_ptr + scale_off, scale, mask=scale_mask)
        x = x / scale
    else:
        x = x / tl.load(scale_ptr)
    return tl.minimum(tl.maximum(x, -FP8_MAX), FP8_MAX)


@triton.jit
def quantize_rows(x, scale_ptr, scale_off, scale_mask, SCALE_KIND: tl.constexpr, FP8_MAX: tl.constexpr):
    """quantize_fp8 of a [heads, dims] tile whose rows are token-heads (their absmax over the last axis)."""
    x = x.to(tl.float32)
    return quantize_fp8(
        x, tl.max(tl.abs(x), axis=1, keep_dims=True), scale_ptr, scale_off, scale_mask, SCALE_KIND, FP8_MAX
    )
