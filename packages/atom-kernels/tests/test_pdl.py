"""Programmatic dependent launch (atom_kernels.pdl): when it is on; that each op launched with it waits for
an input the kernel before it writes late; and that a decode step's kernels give the same bits with it as
without it, eagerly and replayed from a CUDA graph (GPU only: PDL is an sm_90 launch attribute; on the CPU
the interpreter runs the kernels with it off)."""

import pytest
import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents

import atom_kernels.pdl as pdl
from atom_kernels.activation import silu_and_mul
from atom_kernels.attention import paged_decode
from atom_kernels.cache import KVLayout, kv_cache_shapes
from atom_kernels.fp8 import fp8_linear, quantize_weight_ref
from atom_kernels.gdn import Gating, causal_conv1d, gated_delta_rule_recurrent, gdn_gating
from atom_kernels.linear import linear
from atom_kernels.mla import absorb_output, absorb_query, mla_attention, write_latent
from atom_kernels.moe import fused_experts, grouped_topk, topk_softmax
from atom_kernels.norm import rms_norm, rms_norm_gated
from atom_kernels.rotary.fused_qk import qk_norm_rope_write
from atom_kernels.settings import Settings

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _settings(*, interpret: bool, on: bool) -> Settings:
    return Settings(default_backend=None, triton_interpret=interpret, pdl=on)


def test_pdl_is_off_on_the_cpu():
    assert pdl.pdl_launch(torch.device("cpu")) is False


def test_pdl_needs_a_capable_gpu_no_interpreter_and_the_setting(monkeypatch):
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(pdl, "_device_has_pdl", lambda index: True)
    monkeypatch.setattr(pdl, "SETTINGS", _settings(interpret=False, on=True))
    assert pdl.pdl_launch(cuda) is True
    monkeypatch.setattr(pdl, "SETTINGS", _settings(interpret=True, on=True))
    assert pdl.pdl_launch(cuda) is False
    monkeypatch.setattr(pdl, "SETTINGS", _settings(interpret=False, on=False))
    assert pdl.pdl_launch(cuda) is False
    monkeypatch.setattr(pdl, "SETTINGS", _settings(interpret=False, on=True))
    monkeypatch.setattr(pdl, "_device_has_pdl", lambda index: False)  # pre-Hopper, or ROCm
    assert pdl.pdl_launch(cuda) is False


def test_pdl_setting_is_read_from_the_environment(monkeypatch):
    for raw, want in (("0", False), ("off", False), ("1", True), ("auto", True), ("", True)):
        monkeypatch.setenv("ATOM_KERNELS_PDL", raw)
        assert Settings.from_env().pdl is want
    monkeypatch.setenv("ATOM_KERNELS_PDL", "maybe")
    with pytest.raises(ValueError, match="ATOM_KERNELS_PDL='maybe' is not one of: auto, 1"):
        Settings.from_env()


@triton.jit
def _late_copy_kernel(src_ptr, dst_ptr, n, spins, BLOCK: tl.constexpr):
    """Lets the next kernel launch at once, spins (~5 ms), then copies src to dst: a late producer."""
    gdc_launch_dependents()
    t = tl.zeros([BLOCK], tl.float32)
    for _ in range(spins):
        t = t * 0.5 + 1.0
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        x = tl.load(src_ptr + offs, mask=offs < n)
        tl.store(dst_ptr + offs, tl.where(t > 0.0, x, x - x), mask=offs < n)  # the store waits for the spin


@triton.jit
def _no_wait_copy_kernel(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    """A consumer that never waits: what it reads shows whether PDL let it start before the producer ended."""
    for start in range(0, n, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


def _write_late(src: torch.Tensor, dst: torch.Tensor) -> None:
    """dst <- src, ~5 ms after the launch, by a kernel that lets the next launch start immediately."""
    _late_copy_kernel[(1,)](src.view(-1), dst.view(-1), src.numel(), 2_500_000, BLOCK=1024)


needs_pdl_gpu = pytest.mark.gpu(
    min_capability=(9, 0), nvidia=True, reason="programmatic dependent launch needs an sm_90+ GPU"
)


@needs_pdl_gpu
def test_a_consumer_without_the_wait_reads_before_a_late_producer_writes():
    """The harness below works: PDL does start the next kernel early, so a missing wait reads stale input."""
    src = torch.ones(4096, device=DEVICE)
    stale, seen = torch.zeros_like(src), torch.empty_like(src)
    _no_wait_copy_kernel[(1,)](stale, seen, src.numel(), BLOCK=1024, launch_pdl=True)  # compiled first
    torch.cuda.synchronize()
    _write_late(src, stale)
    _no_wait_copy_kernel[(1,)](stale, seen, src.numel(), BLOCK=1024, launch_pdl=True)
    torch.cuda.synchronize()
    assert torch.equal(stale, src)  # written, in the end
    assert not torch.equal(seen, src)  # but after the consumer had read it


def _late_input_cases():
    """(name, inputs, op) for each op that launches with PDL; inputs[0] is the one written late."""
    g = torch.Generator(device="cuda").manual_seed(3)

    def rand(*shape):
        return torch.randn(*shape, generator=g, device="cuda").to(torch.bfloat16)

    k_shape, v_shape = kv_cache_shapes(KVLayout.FLASH, 8, PAGE, HKV, D, torch.bfloat16)
    tables = torch.arange(8, device="cuda", dtype=torch.int32).view(1, 8)
    lens = torch.tensor([100], device="cuda", dtype=torch.int32)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, device="cuda", dtype=torch.float32) / D))
    positions = torch.tensor([7, 9], device="cuda")
    slots = torch.tensor([3, 40], device="cuda")
    w_hidden, w_big = rand(HIDDEN), rand(2 * INTER, HIDDEN) * HIDDEN**-0.5
    w13, w2 = _experts(g)
    ids = torch.stack([torch.randperm(EXPERTS, device="cuda", generator=g)[:TOP_K] for _ in range(32)])
    ids = ids.to(torch.int32)
    weights = torch.rand(32, TOP_K, device="cuda", generator=g)
    x32 = rand(32, HIDDEN)

    def experts(tokens, late_ids=False):
        if late_ids:  # the ordering's first kernel (one program, or the count after a memset) waits
            return lambda i: fused_experts(x32[:tokens], w13, w2, weights[:tokens], i)
        return lambda x: fused_experts(x, w13, w2, weights[:tokens], ids[:tokens])

    return [
        ("topk_softmax", (rand(4, EXPERTS),), lambda x: topk_softmax(x, TOP_K, True)),
        (
            "grouped_topk",
            (rand(4, EXPERTS),),
            lambda x: grouped_topk(x, TOP_K, num_groups=4, topk_groups=2, bias=w_hidden[:EXPERTS].float()),
        ),
        ("fused_experts, one token (gate/up, down, combine)", (rand(1, HIDDEN),), experts(1)),
        ("fused_experts, eight tokens (x late)", (rand(8, HIDDEN),), experts(8)),
        ("fused_experts, eight tokens (ids late: one-program order)", (ids[:8].clone(),), experts(8, True)),
        ("fused_experts, 32 tokens (ids late: three-launch order)", (ids.clone(),), experts(32, True)),
        ("rms_norm", (rand(2, HIDDEN),), lambda x: rms_norm(x, w_hidden, 1e-6)),
        ("linear, one row", (rand(1, HIDDEN),), lambda x: linear(x, w_big)),
        ("linear, eight rows", (rand(8, HIDDEN),), lambda x: linear(x, w_big)),
        (
            "linear, one gated row",
            (rand(1, 2 * HIDDEN),),
            lambda x: linear(x, w_big[:HIDDEN], gated_input=True),
        ),
        ("silu_and_mul", (rand(4, 2 * INTER),), lambda x: silu_and_mul(x)),
        (
            "qk_norm_rope_write",
            (rand(2, HQ, D), rand(2, HKV, D), rand(2, HKV, D), rand(*k_shape), rand(*v_shape)),
            lambda q, k, v, kc, vc: (
                qk_norm_rope_write(
                    q, k, v, None, None, positions, inv_freq, kc, vc, slots, eps=1e-6, rotary_dim=D
                ),
                kc,
                vc,
            ),
        ),
        *_fp8_cases(g, rand),
        *_gdn_cases(g, rand),
        *_mla_cases(rand),
        (
            "paged_decode (four splits and their combine)",
            (rand(*k_shape), rand(1, HQ, D), rand(*v_shape)),
            lambda kc, q, vc: paged_decode(
                q, kc, vc, seq_lens=lens, block_tables=tables, num_splits=4, max_seq_len=128
            ),
        ),
    ]


def _fp8_cases(g, rand):
    """fp8_linear down each path: the weight-only GEMV (one row, a small weight), x quantized then the W8A8
    skinny kernel (one row of a large weight; eight rows, split-K with tickets on a long K), and the
    weight-only MMA kernel (eight rows, a block_k with no power-of-two factor of 16)."""

    def fp8(n, k, block):
        return (*quantize_weight_ref(rand(n, k).float() * k**-0.5, block), block)

    small, large = fp8(2 * INTER, HIDDEN, (128, 128)), fp8(8192, 4096, (128, 128))
    long_k, odd = fp8(1024, 8192, (128, 128)), fp8(1024, HIDDEN, (128, 96))
    return [
        ("fp8_linear, one row (weight-only GEMV)", (rand(1, HIDDEN),), lambda x: fp8_linear(x, *small)),
        ("fp8_linear, one row of a large weight (W8A8)", (rand(1, 4096),), lambda x: fp8_linear(x, *large)),
        ("fp8_linear, eight rows, split K (W8A8)", (rand(8, 8192),), lambda x: fp8_linear(x, *long_k)),
        (
            "fp8_linear, eight rows, block_k 96 (weight-only)",
            (rand(8, HIDDEN),),
            lambda x: fp8_linear(x, *odd),
        ),
    ]


def _gdn_cases(g, rand):
    """A GDN decode layer's kernels: the conv over its windows, the delta rule with its gating (and alone,
    after gdn_gating), the gated norm; states are inputs too (written in place, returned)."""
    seqs, heads, dk, dim, width = 4, 4, 64, 512, 4
    cu = torch.arange(seqs + 1, device="cuda", dtype=torch.int32)
    slots = torch.tensor([5, 0, 3, -1], device="cuda", dtype=torch.int32)  # a padding row
    a_log, dt_bias = (
        torch.rand(heads, device="cuda", generator=g),
        torch.rand(heads, device="cuda", generator=g),
    )
    a, b = rand(seqs, heads), rand(seqs, heads)
    k, v = rand(seqs, heads, dk), rand(seqs, heads, dk)
    conv_w, norm_w = rand(dim, width), rand(dk)

    def delta_rule(q, state):
        out = gated_delta_rule_recurrent(
            q, k, v, None, None, cu, state, slots, gating=Gating(a_log, a, dt_bias, b)
        )
        return out, state

    def gated_delta_rule(a_late, state):
        gates = gdn_gating(a_log, a_late, dt_bias, b)
        return gated_delta_rule_recurrent(rand_q, k, v, *gates, cu, state, slots), state

    rand_q = rand(seqs, heads, dk)
    return [
        ("causal_conv1d, decode", (rand(seqs, dim), rand(8, dim, width - 1)),
         lambda x, window: (causal_conv1d(x, conv_w, None, cu, window, slots, max_seqlen=1), window)),
        ("gated_delta_rule_recurrent, gating fused", (rand(seqs, heads, dk), rand(8, heads, dk, dk).float()), delta_rule),
        ("gdn_gating, then the delta rule", (a.clone(), rand(8, heads, dk, dk).float()), gated_delta_rule),
        ("rms_norm_gated", (rand(seqs * heads, dk), rand(seqs * heads, dk)),
         lambda x, gate: rms_norm_gated(x, gate, norm_w, 1e-6)),
    ]  # fmt: skip


def _mla_cases(rand):
    """The latent cache write, and MLA decode unsplit and in four slices with their combine."""
    rank, rope, pages = 512, 64, 8
    cache = rand(pages, PAGE, rank + rope)
    tables = torch.arange(pages, device="cuda", dtype=torch.int32).view(1, pages)
    lens, cu = (
        torch.tensor([100], device="cuda", dtype=torch.int32),
        torch.tensor([0, 1], device="cuda").int(),
    )
    kv_c, k_pe, slots = rand(2, rank), rand(2, rope), torch.tensor([99, -1], device="cuda")

    def decode(splits):
        return lambda q: mla_attention(
            q, cache, cu, lens, tables, softmax_scale=0.1, max_query_len=1, num_splits=splits
        )

    def write(c, kv_cache):
        write_latent(c, k_pe, kv_cache, slots)
        return kv_cache

    w_uk, w_uv = rand(16, 128, rank), rand(16, 128, rank)
    return [
        ("write_latent", (kv_c, cache.clone()), write),
        ("absorb_query", (rand(2, 16, 128), rand(2, 16, rope)), lambda q, pe: absorb_query(q, pe, w_uk)),
        ("absorb_output", (rand(2, 16, rank),), lambda o: absorb_output(o, w_uv)),
        ("mla_attention, decode", (rand(1, 16, rank + rope),), decode(1)),
        ("mla_attention, decode in four slices", (rand(1, 16, rank + rope),), decode(4)),
    ]


@needs_pdl_gpu
def test_each_op_waits_for_an_input_written_late_by_the_kernel_before_it(monkeypatch):
    monkeypatch.setattr(pdl, "SETTINGS", _settings(interpret=False, on=True))
    for name, inputs, op in _late_input_cases():
        want = op(*[t.clone() for t in inputs])
        first, rest = inputs[0], [t.clone() for t in inputs[1:]]
        late = torch.zeros_like(first)
        op(late.clone(), *[t.clone() for t in rest])  # compiled before the timed pair
        torch.cuda.synchronize()
        _write_late(first, late)
        got = op(late, *rest)
        torch.cuda.synchronize()
        want, got = (want, got) if isinstance(want, tuple) else ((want,), (got,))
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b), name


# Sizes that take every path: a masked and an unmasked GEMV over several K steps, split-K with tickets at
# eight rows (down), four KV splits and their combine; one token's expert tiles, the one-program and the
# three-launch expert orderings (32 tokens x 4 = 128 pairs).
HIDDEN, INTER, HQ, HKV, D, PAGE, LAYERS = 1536, 2816, 8, 2, 64, 16, 3
EXPERTS, TOP_K, EXPERT_INTER = 16, 4, 384


def _experts(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """w13 [E, 2I, H] and w2 [E, H, I] in bf16, scaled to keep activations near one."""
    w13 = torch.randn(EXPERTS, 2 * EXPERT_INTER, HIDDEN, generator=g, device=g.device) * HIDDEN**-0.5
    w2 = torch.randn(EXPERTS, HIDDEN, EXPERT_INTER, generator=g, device=g.device) * EXPERT_INTER**-0.5
    return w13.to(torch.bfloat16), w2.to(torch.bfloat16)


def _model(rows: int, context: int):
    """A few decode layers' weights, a paged cache holding `context` tokens per row, and the step's inputs."""
    g = torch.Generator(device=DEVICE).manual_seed(0)

    def rand(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g, device=DEVICE) * scale).to(torch.bfloat16)

    layers = [
        dict(
            norm1=rand(HIDDEN, scale=0.1) + 1,
            qkv=rand((HQ + 2 * HKV) * D, HIDDEN, scale=HIDDEN**-0.5),
            o=rand(HIDDEN, HQ * D, scale=(HQ * D) ** -0.5),
            norm2=rand(HIDDEN, scale=0.1) + 1,
            gate_up=rand(2 * INTER, HIDDEN, scale=HIDDEN**-0.5),
            down=rand(HIDDEN, INTER, scale=INTER**-0.5),
            router=rand(EXPERTS, HIDDEN, scale=HIDDEN**-0.5),
            experts=_experts(g),
        )
        for _ in range(LAYERS)
    ]
    pages = -(-(context + 1) // PAGE)
    k_shape, v_shape = kv_cache_shapes(KVLayout.FLASH, rows * pages, PAGE, HKV, D, torch.bfloat16)
    caches = [(rand(*k_shape), rand(*v_shape)) for _ in range(LAYERS)]
    tables = torch.randperm(rows * pages, device=DEVICE, generator=g).to(torch.int32).view(rows, pages)
    positions = torch.full((rows,), context, device=DEVICE, dtype=torch.int64)
    slots = (tables[:, context // PAGE].to(torch.int64) * PAGE + context % PAGE).contiguous()
    inv_freq = 1.0 / (10000 ** (torch.arange(0, D, 2, device=DEVICE, dtype=torch.float32) / D))
    return layers, caches, tables, positions, slots, inv_freq


def _step(x, model, context: int):
    """Decode layers over x [rows, HIDDEN], Llama's with a MoE MLP in the middle one: every kernel that
    launches with PDL, in a row."""
    layers, caches, tables, positions, slots, inv_freq = model
    rows = x.shape[0]
    seq_lens = torch.full((rows,), context + 1, device=DEVICE, dtype=torch.int32)
    residual = x
    h = rms_norm(x, layers[0]["norm1"], 1e-6)
    for i, (w, (k_cache, v_cache)) in enumerate(zip(layers, caches, strict=True)):
        if i:
            h, residual = rms_norm(x, w["norm1"], 1e-6, residual)
        qkv = linear(h, w["qkv"]).view(rows, HQ + 2 * HKV, D)
        q, k, v = qkv[:, :HQ], qkv[:, HQ : HQ + HKV], qkv[:, HQ + HKV :]
        q = qk_norm_rope_write(
            q, k, v, None, None, positions, inv_freq, k_cache, v_cache, slots, eps=1e-6, rotary_dim=D
        )
        a = paged_decode(q, k_cache, v_cache, seq_lens=seq_lens, block_tables=tables, max_seq_len=context + 1)
        h, residual = rms_norm(linear(a.view(rows, HQ * D), w["o"]), w["norm2"], 1e-6, residual)
        if i == 1:  # routing, the expert ordering (none for one row), the expert GEMMs and their combine
            weights, ids = topk_softmax(linear(h, w["router"]), TOP_K, True, round_to=torch.bfloat16)
            x = fused_experts(h, *w["experts"], weights, ids)
        else:  # one row: the GEMV applies silu(gate) * up as it loads; more: silu_and_mul, then the MMA kernel
            x = linear(linear(h, w["gate_up"]), w["down"], gated_input=True)
    return x + residual


@needs_pdl_gpu
@pytest.mark.parametrize("rows", [1, 8, 32])
def test_a_decode_step_gives_the_same_bits_with_pdl_eagerly_and_from_a_graph(monkeypatch, rows):
    context = 300
    inputs = [torch.randn(rows, HIDDEN, device=DEVICE).to(torch.bfloat16) for _ in range(3)]
    results = {}
    for on in (False, True):
        monkeypatch.setattr(pdl, "SETTINGS", _settings(interpret=False, on=on))
        model = _model(rows, context)  # fresh caches: each step writes its token's K and V
        eager = [_step(x, model, context).clone() for x in inputs]
        static = inputs[0].clone()
        _step(static, model, context)  # compiled and allocated outside the capture
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = _step(static, model, context)
        replayed = []
        for x in inputs:
            static.copy_(x)
            graph.replay()
            replayed.append(out.clone())
        torch.cuda.synchronize()
        results[on] = (eager, replayed)
    want = results[False][0]
    assert all(torch.isfinite(w).all() for w in want)
    assert len({float(w.float().sum()) for w in want}) == len(want)  # the inputs reach the output
    for got in (results[True][0], results[True][1], results[False][1]):
        for a, b in zip(want, got, strict=True):
            assert torch.equal(a, b)
