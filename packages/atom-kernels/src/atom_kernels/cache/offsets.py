"""Element offsets of each layout, shared by the kernels that write and the kernels that read a cache."""

import triton
import triton.language as tl


@triton.jit
def kv_offsets(blk, off, h, d, num_heads, head_dim, block_size, SHUFFLE: tl.constexpr, X: tl.constexpr):
    """int64 offsets of K and V elements for tokens at (blk, off), heads h, dims d (broadcasting).

    flash:   ((blk*B + off)*H + h)*D + d                       (K and V)
    shuffle: K ((blk*H + h)*(D//X) + d//X)*B*X + off*X + d%X,  V ((blk*H + h)*(B//X) + off//X)*D*X + d*X + off%X
    """
    if SHUFFLE:
        k_off = ((blk * num_heads + h) * (head_dim // X) + d // X) * (block_size * X) + off * X + d % X
        v_off = ((blk * num_heads + h) * (block_size // X) + off // X) * (head_dim * X) + d * X + off % X
    else:
        k_off = ((blk * block_size + off) * num_heads + h) * head_dim + d
        v_off = k_off
    return k_off, v_off
