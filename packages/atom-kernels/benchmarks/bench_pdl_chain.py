"""What programmatic dependent launch does for a chain of decode GEMVs (the idea behind atom_kernels.pdl).

  python -m benchmarks run pdl_chain

Llama-3-8B's 128 one-row projections of a decode step (qkv, o, gate_up, down for 32 layers; bf16 weights
scaled to keep values finite), each reading the previous one's output, alone and with an RMSNorm before
qkv and gate_up, in one CUDA graph. A stand-alone copy of the GEMV, in three modes: 0 plain launches;
1 PDL, each kernel waiting at its start; 2 PDL with the GEMV's first weight tile (and the norm's weight)
loaded before the wait. Outputs of 1 and 2 must equal 0's bit for bit (else it exits); the table gives graph-replay time
per step and the weights' read rate.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_launch_dependents, gdc_wait

from benchmarks.harness.graph_timing import graph_ms


@triton.jit
def _gemv(
    x_ptr, w_ptr, y_ptr, N, K, stride_w, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, MODE: tl.constexpr
):
    rn = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = tl.minimum(rn, N - 1)
    rk = tl.arange(0, BLOCK_K)
    w_ptrs = w_ptr + rows[:, None].to(tl.int64) * stride_w + rk[None, :]
    if MODE >= 1:
        gdc_launch_dependents()
    if MODE == 2:
        w0 = tl.load(w_ptrs)
    if MODE >= 1:
        gdc_wait()
    acc = tl.zeros([BLOCK_N, BLOCK_K], tl.float32)
    k0 = 0
    if MODE == 2:
        acc += w0.to(tl.float32) * tl.load(x_ptr + rk).to(tl.float32)[None, :]
        k0 = BLOCK_K
        w_ptrs += BLOCK_K
    for k in range(k0, K, BLOCK_K):
        acc += tl.load(w_ptrs).to(tl.float32) * tl.load(x_ptr + k + rk).to(tl.float32)[None, :]
        w_ptrs += BLOCK_K
    tl.store(y_ptr + rn, tl.sum(acc, 1).to(y_ptr.dtype.element_ty), mask=rn < N)


@triton.jit
def _norm(x_ptr, w_ptr, y_ptr, N, BLOCK: tl.constexpr, MODE: tl.constexpr):
    r = tl.arange(0, BLOCK)
    if MODE >= 1:
        gdc_launch_dependents()
    if MODE == 2:
        g = tl.load(w_ptr + r, mask=r < N, other=0.0).to(tl.float32)  # a constant: before the wait
    if MODE >= 1:
        gdc_wait()
    if MODE != 2:
        g = tl.load(w_ptr + r, mask=r < N, other=0.0).to(tl.float32)
    x = tl.load(x_ptr + r, mask=r < N, other=0.0).to(tl.float32)
    y = x * tl.rsqrt(tl.sum(x * x) / N + 1e-6) * g
    tl.store(y_ptr + r, y.to(y_ptr.dtype.element_ty), mask=r < N)


HIDDEN, INTER, QKV, LAYERS = 4096, 14336, 6144, 32


def main() -> None:
    torch.manual_seed(0)
    weights = [
        [
            torch.randn(n, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
            for n, k in ((QKV, HIDDEN), (HIDDEN, HIDDEN), (2 * INTER, HIDDEN), (HIDDEN, INTER))
        ]
        for _ in range(LAYERS)
    ]
    gamma = torch.ones(HIDDEN, device="cuda", dtype=torch.bfloat16)
    bufs = [torch.empty(2 * INTER, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
    weight_bytes = sum(w.numel() * w.element_size() for ws in weights for w in ws)

    def step(mode: int, norms: bool) -> None:
        x = bufs[0]
        for ws in weights:
            for j, w in enumerate(ws):
                n, k = w.shape
                if norms and j in (0, 2):
                    _norm[(1,)](
                        x, gamma, bufs[2], HIDDEN, BLOCK=4096, MODE=mode, num_warps=8, launch_pdl=mode >= 1
                    )
                    x = bufs[2]
                y = bufs[1] if x is not bufs[1] else bufs[0]
                bn, bk, warps = (8, 1024 if k >= 8192 else 512, 4) if n > 2048 else (4, 1024, 8)
                _gemv[(triton.cdiv(n, bn),)](
                    x, w, y, n, k, w.stride(0), BLOCK_N=bn, BLOCK_K=bk, MODE=mode, num_warps=warps,
                    launch_pdl=mode >= 1,
                )  # fmt: skip
                x = y

    print(
        f"{'norms':>5} {'mode':>4} {'us/step':>9} {'weights TB/s':>13} {'x mode 0':>9} {'bits = mode 0':>14}"
    )
    for norms in (False, True):
        base = want = None
        for mode in (0, 1, 2):
            torch.manual_seed(1)
            for b in bufs:
                b.copy_(torch.randn_like(b))
            step(mode, norms)
            got = torch.cat(bufs).clone()
            want = got if mode == 0 else want
            ms = graph_ms([lambda m=mode, n=norms: step(m, n)], min_replay_ms=20, replays=10)
            base = ms if mode == 0 else base
            same = bool(torch.equal(got, want) and got.isfinite().all())
            if not same:
                raise SystemExit(f"mode {mode} (norms={norms}) does not give mode 0's bits")
            print(
                f"{norms!s:>5} {mode:>4} {ms * 1e3:9.1f} {weight_bytes / ms / 1e9:13.2f} {base / ms:9.3f} {same!s:>14}"
            )


if __name__ == "__main__":
    main()
