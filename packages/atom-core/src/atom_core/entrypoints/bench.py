"""Offline throughput and latency: N random prompts, submitted at once or arriving over time (a Poisson
process of --request-rate requests a second, as vLLM's serving benchmark draws them), run to completion
through the engine."""

from __future__ import annotations

import math
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace

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
    steps: int = 0  # engine steps taken
    overlapped_steps: int = 0  # of those, launched while the step before was still in flight
    request_rate: float | None = None  # requests a second (None: all at once)
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
            (
                "steps overlapping the host",
                f"{self.overlapped_steps} / {self.steps} ({self.overlapped_steps / max(self.steps, 1):.1%})",
            ),
        ]
        if self.request_rate is not None:
            rows.insert(1, ("arrivals", f"{self.request_rate:g} requests/s (Poisson)"))
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
    request_rate: float = math.inf,
    params: SamplingParams | None = None,
    progress=None,
) -> BenchResult:
    """params: each request's sampling (max_tokens is output_len; default greedy); request_rate: mean
    arrivals a second (inf: all at once)."""
    progress = (
        progress or sys.stderr
    )  # looked up now: a default bound at import would outlive a swapped stderr
    gen = torch.Generator().manual_seed(seed)
    vocab = engine.model_config.vocab_size
    params = params or SamplingParams(temperature=0)
    params = replace(params, max_tokens=output_len, ignore_eos=True)
    engine.add_request(
        {"prompt_token_ids": torch.randint(0, vocab, (input_len,), generator=gen).tolist()},
        SamplingParams(temperature=0, max_tokens=2, ignore_eos=True),
        request_id="warmup",
    )
    while engine.has_unfinished_requests():
        engine.step()
    prompts = [torch.randint(0, vocab, (input_len,), generator=gen).tolist() for _ in range(num_prompts)]
    gaps = (
        torch.distributions.Exponential(request_rate).sample((num_prompts,))
        if math.isfinite(request_rate)
        else None
    )
    arrivals = [0.0] * num_prompts if gaps is None else torch.cumsum(gaps, 0).tolist()
    first_token, done = {}, {}
    preempted_before = engine.scheduler.num_preemptions
    drafted, accepted, verified, overlapped = (
        engine.stats.num_draft_tokens,
        engine.stats.num_accepted_tokens,
        engine.stats.num_verifications,
        engine.stats.num_async_steps,
    )
    steps, added = 0, 0
    start = time.perf_counter()
    while added < num_prompts or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while added < num_prompts and arrivals[added] <= now:
            engine.add_request({"prompt_token_ids": prompts[added]}, params, request_id=f"bench-{added}")
            added += 1
        if not engine.has_unfinished_requests():  # idle until the next arrival
            time.sleep(max(0.0, arrivals[added] - now))
            continue
        steps += 1
        for out in engine.step():
            now = time.perf_counter() - start
            first_token.setdefault(out.request_id, now - arrivals[int(out.request_id[6:])])
            if out.finished:
                done[out.request_id] = now - arrivals[int(out.request_id[6:])]
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
        steps,
        engine.stats.num_async_steps - overlapped,
        None if math.isinf(request_rate) else request_rate,
    )
    if engine.drafter is not None:
        result.draft_tokens = engine.stats.num_draft_tokens - drafted
        result.accepted_tokens = engine.stats.num_accepted_tokens - accepted
        steps = engine.stats.num_verifications - verified
        result.acceptance_rate = result.accepted_tokens / max(result.draft_tokens, 1)
        result.mean_accepted_length = 1 + result.accepted_tokens / max(steps, 1)
    return result
