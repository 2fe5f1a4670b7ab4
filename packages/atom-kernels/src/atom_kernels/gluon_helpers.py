"""Small Gluon device functions shared by the Gluon kernels (attention/decode_e4m3.py,
cache/write_shuffle_e4m3.py).

Reductions' combine functions are written here rather than taken from Gluon (gl.max, gl.sum, ...): Gluon's
own wrap Triton functions, which TRITON_INTERPRET=1 (the CPU tests) turns into interpreter objects that a
compiled kernel cannot call.
"""

from triton.experimental import gluon
from triton.experimental.gluon import language as gl


@gluon.jit
def max2(a, b):
    return gl.maximum(a, b)


@gluon.jit
def add2(a, b):
    return a + b


@gluon.jit
def or2(a, b):
    return a | b


@gluon.jit
def page_of(pos, block_size, PAGE: gl.constexpr):
    """(block, offset in the block) of positions or slots pos; PAGE: block_size when it is a power of two
    (shifts and masks), else 0 (divisions by the runtime value)."""
    if PAGE > 0:
        return pos // PAGE, pos % PAGE
    else:
        return pos // block_size, pos % block_size
