"""Offline throughput and latency: N random prompts submitted at once, run to completion through the engine."""

from __future__ import annotations

import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch

from atom_core.engine.llm_engine import LLMEngine
from atom_core.engine.sampling_params import SamplingParams


@dataclass(slots=True)
class BenchResult:
    num_prompts: int
    input_len: int
    output_len: int
    elapsed_s: float
    output_tokens: int
    output_tok_s: float
    total_tok_s: float
    ttft_ms_p50: float
    ttft_ms_p90: float
    latency_ms_p50: float
    latency_ms_p90: float
    preemptions: int
    draft_tokens: int = 0  # speculative decoding: tokens proposed
    accepted_tokens: int = 0  # and accepted
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None  # tokens a verifying step emits per sequence (1 + accepted)

    def table(self) -> str:
        rows = [
            ("requests", f"{self.num_prompts} x ({self.input_len} in, {self.output_len} out)"),
            ("elapsed", f"{self.elapsed_s:.2f} s"),
            ("output throughput", f"{self.output_tok_s:,.1f} tok/s"),
            ("total throughput", f"{self.total_tok_s:,.1f} tok/s"),
            ("time to first token p50 / p90", f"{self.ttft_ms_p50:.1f} / {self.ttft_ms_p90:.1f} ms"),
            ("request latency p50 / p90", f"{self.latency_ms_p50:.1f} / {self.latency_ms_p90:.1f} ms"),
            ("preemptions", str(self.preemptions)),
        ]
        if self.acceptance_rate is not None:
            rows += [
                (
                    "draft acceptance",
                    f"{self.accepted_tokens} / {self.draft_tokens} ({self.acceptance_rate:.1%})",
                ),
                ("mean accepted length", f"{self.mean_accepted_length:.2f} tokens per verify step"),
            ]
        width = max(len(k) for k, _ in rows)
        return "\n".join(f"{k:<{width}}  {v}" for k, v in rows)

    def as_dict(self) -> dict:
        return asdict(self)


def _pct(values: list[float], q: float) -> float:
    return (
        statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] if len(values) > 1 else values[0]
    )


def run_bench(
    engine: LLMEngine,
    *,
    num_prompts: int,
    input_len: int,
    output_len: int,
    seed: int = 0,
    progress=None,
) -> BenchResult:
    progress = (
        progress or sys.stderr
    )  # looked up now: a default bound at import would outlive a swapped stderr
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.model_config.vocab_size
    params = SamplingParams(temperature=0, max_tokens=output_len, ignore_eos=True)
    engine.add_request(
        {"prompt_token_ids": torch.randint(0, vocab, (input_len,), generator=gen).tolist()},
        SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
        request_id="warmup",
    )
    while engine.has_unfinished_requests():
        engine.step()
    start = time.perf_counter()
    for i in range(num_prompts):
        ids = torch.randint(0, vocab, (input_len,), generator=gen).tolist()
        engine.add_request({"prompt_token_ids": ids}, params, request_id=f"bench-{i}")
    first_token, done = {}, {}
    preempted_before = engine.scheduler.num_preemptions
    drafted, accepted, verified = (
        engine.stats.num_draft_tokens,
        engine.stats.num_accepted_tokens,
        engine.stats.num_verifications,
    )
    while engine.has_unfinished_requests():
        for out in engine.step():
            now = time.perf_counter() - start
            first_token.setdefault(out.request_id, now)
            if out.finished:
                done[out.request_id] = now
                print(
                    f"\r[atom bench] {len(done)}/{num_prompts} requests done",
                    end="",
                    file=progress,
                    flush=True,
                )
    elapsed = time.perf_counter() - start
    print(file=progress)
    ttft = [v * 1e3 for v in first_token.values()]
    latency = [v * 1e3 for v in done.values()]
    out_tokens = num_prompts * output_len
    result = BenchResult(
        num_prompts,
        input_len,
        output_len,
        elapsed,
        out_tokens,
        out_tokens / elapsed,
        num_prompts * (input_len + output_len) / elapsed,
        _pct(ttft, 50),
        _pct(ttft, 90),
        _pct(latency, 50),
        _pct(latency, 90),
        engine.scheduler.num_preemptions - preempted_before,
    )
    if engine.drafter is not None:
        result.draft_tokens = engine.stats.num_draft_tokens - drafted
        result.accepted_tokens = engine.stats.num_accepted_tokens - accepted
        steps = engine.stats.num_verifications - verified
        result.acceptance_rate = result.accepted_tokens / max(result.draft_tokens, 1)
        result.mean_accepted_length = 1 + result.accepted_tokens / max(steps, 1)
    return result
