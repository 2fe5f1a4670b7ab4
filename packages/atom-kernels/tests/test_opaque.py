"""atom_kernels.opaque: each entry point is one opaque custom op under torch.compile (schemas and fake
shapes checked by torch's opcheck), a compiled graph equals the eager entry points at every row count
without recompiling, and eager calls never reach the dispatcher."""

import pytest
import torch

from atom_kernels import opaque
from atom_kernels.activation import opaque as activation_ops
from atom_kernels.fp8 import opaque as fp8_ops
from atom_kernels.fp8.ref import quantize_weight_ref
from atom_kernels.linear import opaque as linear_ops
from atom_kernels.moe import ExpertScales
from atom_kernels.moe import opaque as moe_ops
from atom_kernels.norm import opaque as norm_ops
from atom_kernels.rotary import opaque as rotary_ops

torch.manual_seed(0)


def _experts(e=4, h=32, i=16):
    return torch.randn(e, 2 * i, h) * 0.2, torch.randn(e, h, i) * 0.2


def _rotary_args(t, hq=4, hkv=2, d=16):
    return (
        torch.arange(t),
        torch.randn(t, hq, d),
        torch.randn(t, hkv, d),
        1.0 / (10000 ** (torch.arange(0, d, 2, dtype=torch.float32) / d)),
    )


def _fp8_weight(n=48, k=64, block=(16, 32)):
    w = torch.randn(n, k) * 0.1
    return quantize_weight_ref(w, block)


def _fp8_experts(e=4, h=64, i=32, block=(16, 32)):
    """(w13, w2, ExpertScales) in e4m3."""
    w13, w2 = _experts(e, h, i)

    def quantize(w_e):
        return quantize_weight_ref(w_e, block)

    (q13, s13), (q2, s2) = ([torch.stack(t) for t in zip(*map(quantize, w), strict=True)] for w in (w13, w2))
    return q13, q2, ExpertScales(s13, s2, block)


# (op, sample args) for torch.library.opcheck: the schema, the fake implementation and the
# functionalized (AOT) form against the real implementation
OPCHECK_CASES = {
    "linear": (
        linear_ops._linear_op,
        (torch.randn(5, 32), torch.randn(24, 32), torch.randn(24), False, None, None),
    ),
    "linear_gated": (
        linear_ops._linear_op,
        (torch.randn(5, 64), torch.randn(24, 32), None, True, None, None),
    ),
    "linear_fp32_out": (
        linear_ops._linear_op,
        (torch.randn(5, 32).half(), torch.randn(24, 32).half(), None, False, torch.float32, None),
    ),
    "linear_sigmoid_gate": (
        linear_ops._linear_op,
        (torch.randn(1, 32), torch.randn(24, 32), None, False, None, torch.randn(1, 4, 16)[..., :8]),
    ),
    "rms_norm": (norm_ops._rms_norm_op, (torch.randn(5, 32), torch.randn(32), 1e-6, 0.0)),
    "rms_norm_residual": (
        norm_ops._rms_norm_residual_op,
        (torch.randn(5, 32), torch.randn(32), 1e-6, torch.randn(5, 32), 1.0),
    ),
    "rms_norm_gated": (
        norm_ops._rms_norm_gated_op,
        (torch.randn(6, 16), torch.randn(6, 16), torch.randn(16), 1e-6),
    ),
    "silu_and_mul": (activation_ops._silu_and_mul_op, (torch.randn(5, 32),)),
    "apply_rotary": (rotary_ops._apply_rotary_op, (*_rotary_args(5), 16, 1.0, True)),
    "apply_mrope": (
        rotary_ops._apply_mrope_op,
        (torch.arange(5).expand(3, 5).contiguous(), *_rotary_args(5)[1:], 16, [2, 3, 3], True, 1.0, True),
    ),
    "topk_softmax": (moe_ops._topk_softmax_op, (torch.randn(5, 8), 2, True, torch.bfloat16)),
    "grouped_topk": (
        moe_ops._grouped_topk_op,
        (torch.randn(5, 16), 4, 4, 2, torch.randn(16), "sigmoid", True, 2.5),
    ),
    "fused_experts": (
        moe_ops._fused_experts_op,
        (
            torch.randn(5, 32),
            *_experts(),
            torch.rand(5, 2),
            torch.randint(0, 4, (5, 2), dtype=torch.int32),
            None,  # no scales: bf16/fp32 experts
            None,
            None,
            None,  # no shared expert
            None,
        ),
    ),
    "fused_experts with a gated shared expert": (
        moe_ops._fused_experts_op,
        (
            torch.randn(5, 32),
            *_experts(),
            torch.rand(5, 2),
            torch.randint(0, 4, (5, 2), dtype=torch.int32),
            None,
            None,
            None,
            torch.randn(5, 32),
            torch.randn(5, 1),
        ),
    ),
    "fused_experts with biases and GPT-OSS's activation": (
        moe_ops._fused_experts_op,
        (
            torch.randn(5, 32),
            *_experts(),
            torch.rand(5, 2),
            torch.randint(0, 4, (5, 2), dtype=torch.int32),
            None,
            None,
            None,
            None,
            None,
            "swiglu_oai",
            1.702,
            7.0,
            torch.randn(4, 32),  # w13 bias [E, 2I]
            torch.randn(4, 32),  # w2 bias [E, H]
        ),
    ),
    "fused_experts with MXFP4 weights": (
        moe_ops._fused_experts_op,
        (
            torch.randn(5, 64),
            torch.randint(0, 256, (4, 64, 32), dtype=torch.uint8),  # w13 bytes [E, 2I, H / 2]
            torch.randint(0, 256, (4, 64, 16), dtype=torch.uint8),  # w2 bytes [E, H, I / 2]
            torch.rand(5, 2),
            torch.randint(0, 4, (5, 2), dtype=torch.int32),
            *[None] * 5,
            "silu",
            1.702,
            7.0,
            None,
            None,
            torch.randint(120, 130, (4, 64, 2), dtype=torch.uint8),  # e8m0 scales [E, 2I, H / 32]
            torch.randint(120, 130, (4, 64, 1), dtype=torch.uint8),  # [E, H, I / 32]
        ),
    ),
}


@pytest.mark.parametrize("name", sorted(OPCHECK_CASES))
def test_opcheck(name):
    op, args = OPCHECK_CASES[name]
    torch.library.opcheck(op, args)


# opcheck's schema test compares inputs before and after with arithmetic the CPU lacks for e4m3
FP8_CHECKS = ("test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")


def test_opcheck_fp8_ops():
    wq, ws = _fp8_weight()
    x = torch.randn(5, 64)
    torch.library.opcheck(
        fp8_ops._fp8_linear_op, (x, wq, ws, [16, 32], None, False, False), test_utils=FP8_CHECKS
    )
    gate_up = torch.randn(5, 128)
    torch.library.opcheck(
        fp8_ops._fp8_linear_op, (gate_up, wq, ws, [16, 32], None, False, True), test_utils=FP8_CHECKS
    )
    q13, q2, scales = _fp8_experts()
    args = (torch.randn(5, 64), q13, q2, torch.rand(5, 2), torch.randint(0, 4, (5, 2), dtype=torch.int32))
    torch.library.opcheck(
        moe_ops._fused_experts_op, (*args, scales.w13, scales.w2, [16, 32], None, None), test_utils=FP8_CHECKS
    )


class _Block(torch.nn.Module):
    """A decoder-like step through every opaque entry point, with row-count-dependent kernel choices
    inside them (the traced graph must not freeze those)."""

    def __init__(self, h=32, e=4):
        super().__init__()
        self.norm = torch.nn.Parameter(torch.rand(h) + 0.5)
        self.qkv = torch.nn.Parameter(torch.randn(4 * 16 + 2 * 2 * 16, h) * 0.1)
        self.o = torch.nn.Parameter(torch.randn(h, 64) * 0.1)
        self.gate = torch.nn.Parameter(torch.randn(e, h) * 0.3)
        w13, w2 = _experts(e, h, 16)
        self.w13, self.w2 = torch.nn.Parameter(w13), torch.nn.Parameter(w2)
        self.up = torch.nn.Parameter(torch.randn(64, h) * 0.1)
        self.down = torch.nn.Parameter(torch.randn(h, 32) * 0.1)
        wq, ws = _fp8_weight(h, h, (16, 16))
        self.register_buffer("wq", wq)
        self.register_buffer("ws", ws)
        self.register_buffer("inv_freq", _rotary_args(1)[3])

    def forward(self, x, positions):
        t = x.shape[0]
        y, res = opaque.rms_norm(x, self.norm, 1e-6, x * 0.5)
        q, k, v = opaque.linear(y, self.qkv).split([64, 32, 32], dim=-1)
        q, k = q.reshape(t, 4, 16).contiguous(), k.reshape(t, 2, 16).contiguous()
        q, k = opaque.apply_rotary(positions, q, k, self.inv_freq, rotary_dim=16)
        mixed = opaque.rms_norm_gated(q.reshape(-1, 16), q.reshape(-1, 16), self.norm[:16], 1e-6)
        y = opaque.linear(mixed.reshape(t, 64), self.o) + k.sum() + v.mean()
        w, ids = opaque.topk_softmax(opaque.linear(y, self.gate), 2, True, round_to=torch.float16)
        y = opaque.fused_experts(y, self.w13, self.w2, w, ids) + res
        y = opaque.linear(opaque.silu_and_mul(opaque.linear(y, self.up)), self.down)
        gw, gids = opaque.grouped_topk(y[:, :16], 2, num_groups=4, topk_groups=2)
        return opaque.fp8_linear(y, self.wq, self.ws, (16, 16)) + (gw.sum() + gids.sum()) * 1e-3


def test_compiled_graph_is_opaque_and_equal_at_every_row_count():
    torch._dynamo.reset()
    block = _Block()
    seen: list[set[str]] = []

    def backend(gm, example_inputs):
        seen.append({str(n.target) for n in gm.graph.nodes if n.op == "call_function"})
        return gm.forward

    compiled = torch.compile(block, backend=backend, fullgraph=True, dynamic=True)
    with torch.no_grad(), torch.compiler.set_stance("fail_on_recompile"):
        # 2..40 rows cross the skinny/GEMM switch (1 row is Dynamo's own 0/1 specialization)
        for rows in (3, 5, 40, 2):
            x = torch.randn(rows, 32)
            pos = torch.arange(rows) + 7
            if rows == 3:  # the first call compiles; later sizes must reuse the graph
                with torch.compiler.set_stance("default"):
                    got = compiled(x, pos)
            else:
                got = compiled(x, pos)
            torch.testing.assert_close(got, block(x, pos), rtol=1e-5, atol=1e-5)
    assert len(seen) == 1
    ops = {t for t in seen[0] if t.startswith("atom_kernels.")}
    assert {
        f"atom_kernels.{name}.default"
        for name in (
            "linear",
            "fp8_linear",
            "rms_norm_residual",
            "rms_norm_gated",
            "silu_and_mul",
            "apply_rotary",
            "topk_softmax",
            "grouped_topk",
            "fused_experts",
        )
    } <= ops


def test_fp8_experts_through_the_compiled_op():
    torch._dynamo.reset()
    q13, q2, scales = _fp8_experts()

    def step(x, w, ids):
        return opaque.fused_experts(x, q13, q2, w, ids, scales=scales)

    x, w, ids = torch.randn(6, 64), torch.rand(6, 2), torch.randint(0, 4, (6, 2), dtype=torch.int32)
    got = torch.compile(step, backend="aot_eager", fullgraph=True, dynamic=True)(x, w, ids)
    torch.testing.assert_close(got, step(x, w, ids))


def test_eager_calls_skip_the_dispatcher(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an eager call went through the custom op")

    monkeypatch.setattr(linear_ops, "_linear_op", refuse)
    x, w = torch.randn(3, 8), torch.randn(4, 8)
    torch.testing.assert_close(opaque.linear(x, w), x @ w.T)
