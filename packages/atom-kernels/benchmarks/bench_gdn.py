"""Gated delta net on the H200 (issue targets): recurrent decode over state slots and chunked prefill.

  python -m benchmarks run gdn

Decode: HV=32, D=128, fp32 state, B=1, 8 and 64: bytes = state read + written (+ q/k/v/o), TB/s and %
of the copy bandwidth measured in this run, and the speed over flash-linear-attention's fused_recurrent
(CUDA-graph replays both; eager calls beside them, where the host's cost shows at small batch). Prefill: one sequence of 8k and 32k tokens, H=32, D=128, bf16, against
flash-linear-attention's chunk_gated_delta_rule on the same inputs in the same run when the package is
importable (install its wheels with --no-deps; the table says when it was not). Times are medians of
CUDA-graph replays for decode and of do_bench for prefill (which plans chunks on the host); prefill also
reports GPU time (the kernels' own time, torch.profiler, mean of 5 calls) for both, free of host overhead.
"""

from __future__ import annotations

import argparse
import datetime
from functools import partial

import torch
import triton

from atom_kernels.gdn import gated_delta_rule_chunked, gated_delta_rule_recurrent
from benchmarks.harness.ceilings import measure_ceilings
from benchmarks.harness.gdn_cases import DEV, D, H, fla_chunk, fla_op, inputs, kernel_ms


def _decode_row(batch: int, copy_bw: float, fla) -> dict:
    """One decode step of `batch` sequences from state slots (randomly placed), timed as CUDA-graph
    replays; beside it flash-linear-attention's fused_recurrent on the same inputs and states, checked
    against ours first. Eager wall times too (the host's share at small batch)."""
    q, k, v, g, beta = inputs(batch)
    state = torch.randn(batch + 8, H, D, D, device=DEV) * 0.01
    idx = torch.randperm(batch + 8, device=DEV)[:batch].to(torch.int32)
    cu = torch.arange(batch + 1, device=DEV, dtype=torch.int32)
    out = torch.empty_like(v)
    h0 = state[idx.long()].transpose(-1, -2).contiguous()  # FLA's [N, H, K, V], before ours writes
    ours = partial(gated_delta_rule_recurrent, q, k, v, g, beta, cu, state, idx, out=out)
    ms = triton.testing.do_bench_cudagraph(ours, rep=100, return_mode="median")
    nbytes = 2 * batch * H * D * D * 4 + 4 * batch * H * D * 2
    row = dict(
        case=f"decode B={batch} HV={H} D={D} fp32 state",
        ms=ms,
        tb_s=nbytes / ms / 1e9,
        pct_copy=100 * nbytes / ms / 1e-3 / copy_bw,
        eager_ms=triton.testing.do_bench(ours, return_mode="median"),
    )
    if fla is not None:
        # g and beta by name: FLA's op takes per-key and per-value gates (gk, gv) between them
        run = partial(
            fla, q[:, None], k[:, None], v[:, None], g=g[:, None], beta=beta[:, None],
            initial_state=h0, output_final_state=True, use_qk_l2norm_in_kernel=True,
        )  # fmt: skip
        state[idx.long()] = h0.transpose(-1, -2)  # back to the states FLA starts from
        ours()
        want, _ = run()
        row["max_rel_err"] = (
            (out.float() - want[:, 0].float()).abs().max() / want.float().abs().max()
        ).item()
        row["fla_ms"] = triton.testing.do_bench_cudagraph(run, rep=100, return_mode="median")
        row["fla_eager_ms"] = triton.testing.do_bench(run, return_mode="median")
        row["x_fla"] = row["fla_ms"] / ms
        row["eager_x_fla"] = row["fla_eager_ms"] / row["eager_ms"]
    return row


def main():
    parser = argparse.ArgumentParser()
    parser.parse_args()
    copy_bw, _ = measure_ceilings(DEV)
    rows = [_decode_row(batch, copy_bw, fla_op("fused_recurrent_gated_delta_rule")) for batch in (1, 8, 64)]
    chunk_fla = fla_chunk()
    for tokens in (8192, 32768):
        q, k, v, g, beta = inputs(tokens)
        state = torch.zeros(1, H, D, D, device=DEV)
        idx = torch.zeros(1, device=DEV, dtype=torch.int32)
        cu = torch.tensor([0, tokens], device=DEV, dtype=torch.int32)
        out = torch.empty_like(v)
        run = partial(
            gated_delta_rule_chunked,
            q,
            k,
            v,
            g,
            beta,
            cu,
            state,
            idx,
            has_initial_state=torch.zeros(1, dtype=torch.bool, device=DEV),
            out=out,
        )
        run()
        row = dict(
            case=f"chunked prefill T={tokens} H={H} D={D}",
            ms=triton.testing.do_bench(run, return_mode="median"),
            gpu_ms=kernel_ms(run),
        )
        if chunk_fla is not None:
            fla = partial(
                chunk_fla,
                q[None],
                k[None],
                v[None],
                g[None],
                beta[None],
                use_qk_l2norm_in_kernel=True,
                output_final_state=True,
            )
            want, final = fla()
            err = ((out.float() - want[0].float()).abs().max() / want.float().abs().max()).item()
            state_err = (
                (state[0].float() - final[0].transpose(-1, -2).float()).abs().max()
                / final.float().abs().max()
            ).item()
            row.update(
                fla_ms=triton.testing.do_bench(fla, return_mode="median"),
                fla_gpu_ms=kernel_ms(fla),
                max_rel_err=err,
                state_rel_err=state_err,
            )
            row["x_fla"] = row["fla_ms"] / row["ms"]
            row["gpu_over_fla_gpu"] = row["gpu_ms"] / row["fla_gpu_ms"]
        rows.append(row)
    record = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        torch=torch.__version__,
        triton=triton.__version__,
        copy_tb_s=copy_bw / 1e12,
        rows=rows,
    )
    print(f"\n{record['device']}  copy {copy_bw / 1e12:.2f} TB/s")
    print(
        f"{'case':38} {'ms':>8} {'TB/s':>6} {'% copy':>7} {'fla ms':>8} {'x fla':>6} {'rel err':>8}"
        f" {'GPU ms':>7} {'fla GPU':>7} {'GPU/fla':>7}"
    )
    for r in rows:
        bw = f"{r['tb_s']:6.2f} {r['pct_copy']:6.1f}%" if "tb_s" in r else f"{'':6} {'':7}"
        fla = f"{r['fla_ms']:8.3f} {r['x_fla']:6.2f} {r['max_rel_err']:8.1e}" if "fla_ms" in r else f"{'':25}"
        gpu = f" {r['gpu_ms']:7.3f}" if "gpu_ms" in r else ""
        gpu += f" {r['fla_gpu_ms']:7.3f} {r['gpu_over_fla_gpu']:7.2f}" if "fla_gpu_ms" in r else ""
        print(f"{r['case']:38} {r['ms']:8.3f} {bw} {fla}{gpu}")
    return record


if __name__ == "__main__":
    main()
