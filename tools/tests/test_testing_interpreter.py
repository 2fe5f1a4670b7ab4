"""tools.testing_interpreter: the interpreter patches triton.language once per launch, with the same results."""

import os

import pytest
import torch
import triton
import triton.language as tl

pytestmark = pytest.mark.skipif(
    os.environ.get("TRITON_INTERPRET") != "1", reason="the interpreter runs where no GPU is (root conftest)"
)


@triton.jit
def _scaled(x, s):
    return x * s


@triton.jit
def _kernel(x_ptr, out_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    acc = tl.zeros([N], dtype=tl.float32)  # a helper of triton.language.standard (sees tl.core)
    for i in range(4):
        acc += _scaled(tl.load(x_ptr + offs), i + 1.0)  # our helper, same globals as the kernel
    tl.store(out_ptr + offs, acc)


def test_helpers_patch_once_per_launch_and_compute_the_same(monkeypatch):
    from triton.runtime import interpreter

    from tools.testing_interpreter import install

    assert install()  # the root conftest installed it already: idempotent
    patched = []
    patch_lang = interpreter._patch_lang
    monkeypatch.setattr(interpreter, "_patch_lang", lambda fn: patched.append(fn.__name__) or patch_lang(fn))
    x = torch.arange(8, dtype=torch.float32)
    out = torch.empty_like(x)
    _kernel[(3,)](x, out, N=8)
    torch.testing.assert_close(out, x * 10)
    # the launch, then tl.zeros' module once (first program); _scaled (and later programs) not again
    assert patched == ["_kernel", "zeros"]
