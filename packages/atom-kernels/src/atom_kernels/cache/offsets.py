"""Element offsets of each layout, shared by the kernels that write and the kernels that read a cache."""

import triton
import triton.language as tl


@triton.jit
def kv_offsets(
    blk,
    off,
    h,
    d,
    num_heads,
    head_dim,
    block_size,
    stride_blk,
    stride_tok,
    stride_head,
    LAYOUT: tl.constexpr,
    X: tl.constexpr,
):
    """int64 offsets of K and V elements for tokens at (blk, off), heads h, dims d (broadcasting).

    LAYOUT (layout.layout_code):
    0 flash, contiguous: ((blk*B + off)*H + h)*D + d                            (K and V)
    1 shuffle: K ((blk*H + h)*(D//X) + d//X)*B*X + off*X + d%X,  V ((blk*H + h)*(B//X) + off//X)*D*X + d*X + off%X
    2 flash, strided views: blk*stride_blk + off*stride_tok + h*stride_head + d  (K and V share strides, as
      vLLM's packed K|V pages do). A variant of its own: the fp8 decode path is issue-bound, and runtime
      strides (a 64-bit multiply per element) slowed it for contiguous caches, whose head_dim stride is a
      compile-time constant.
    """
    if LAYOUT == 1:
        k_off = ((blk * num_heads + h) * (head_dim // X) + d // X) * (block_size * X) + off * X + d % X
        v_off = ((blk * num_heads + h) * (block_size // X) + off // X) * (head_dim * X) + d * X + off % X
    elif LAYOUT == 2:
        k_off = blk * stride_blk + off * stride_tok + h * stride_head + d
        v_off = k_off
    else:
        k_off = ((blk * block_size + off) * num_heads + h) * head_dim + d
        v_off = k_off
    return k_off, v_off
