"""Offline throughput and latency: N random prompts, submitted at once or arriving over time (a Poisson
process of --request-rate requests a second, as vLLM's serving benchmark draws them), run to completion
through the engine. Each request's prompt and output lengths are drawn uniformly from
[len x (1 - range_ratio), len x (1 + range_ratio)], as vLLM's random dataset draws them (0: all equal)."""

from __future__ import annotations

import math
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch
from tqdm import tqdm

from atom_core.engine.llm_engine import LLMEngine
from atom_core.engine.sampling_params import SamplingParams
from atom_core.entrypoints.percentiles import percentile
from atom_core.entrypoints.random_lengths import length_bounds


@dataclass(slots=True)
class BenchResult:
    num_prompts: int
    input_len: int  # the mean asked for (each request's drawn around it: range_ratio)
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
    range_ratio: float = 0.0
    input_tokens: int = 0  # all prompts' tokens

    def table(self) -> str:
        spread = f", each within ±{self.range_ratio:.0%}" if self.range_ratio else ""
        rows = [
            ("requests", f"{self.num_prompts} x ({self.input_len} in, {self.output_len} out){spread}"),
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


def _lengths(mean: int, ratio: float, count: int, gen: torch.Generator) -> list[int]:
    """count lengths drawn uniformly from the integers in [mean x (1 - ratio), mean x (1 + ratio)], at
    least 1 (vLLM's random dataset's rule). Ratio 0 draws nothing: a seed's prompts stay those of the runs
    before lengths could spread."""
    if ratio == 0:
        return [mean] * count
    low, high = length_bounds(mean, ratio)
    return torch.randint(low, high + 1, (count,), generator=gen).tolist()


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
    range_ratio: float = 0.0,
) -> BenchResult:
    """params: each request's sampling (max_tokens is its output length; default greedy); request_rate:
    mean arrivals a second (inf: all at once); range_ratio in [0, 1): how far each request's lengths
    spread around input_len and output_len."""
    if not 0 <= range_ratio < 1:
        raise ValueError(f"range_ratio must be in [0, 1), got {range_ratio}")
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
    in_lens = _lengths(input_len, range_ratio, num_prompts, gen)
    out_lens = _lengths(output_len, range_ratio, num_prompts, gen)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in in_lens]
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
    steps, added, produced = 0, 0, {}
    out_tokens = sum(out_lens)
    # the tokens made so far, updated every step (requests finishing together would move it only at the end)
    bar = tqdm(total=out_tokens, unit="tok", desc="[atom bench] output", file=progress, dynamic_ncols=True)
    start = time.perf_counter()
    while added < num_prompts or engine.has_unfinished_requests():
        now = time.perf_counter() - start
        while added < num_prompts and arrivals[added] <= now:
            each = replace(params, max_tokens=out_lens[added])
            engine.add_request({"prompt_token_ids": prompts[added]}, each, request_id=f"bench-{added}")
            added += 1
        if not engine.has_unfinished_requests():  # idle until the next arrival
            time.sleep(max(0.0, arrivals[added] - now))
            continue
        steps += 1
        for out in engine.step():
            now = time.perf_counter() - start
            first_token.setdefault(out.request_id, now - arrivals[int(out.request_id[6:])])
            made = len(out.outputs[0].token_ids)  # (cumulative outputs: the bar moves by what is new)
            bar.update(made - produced.get(out.request_id, 0))
            produced[out.request_id] = made
            if out.finished:
                done[out.request_id] = now - arrivals[int(out.request_id[6:])]
                bar.set_postfix_str(f"{len(done)}/{num_prompts} requests done", refresh=False)
    elapsed = time.perf_counter() - start
    bar.close()
    ttft = [v * 1e3 for v in first_token.values()]
    latency = [v * 1e3 for v in done.values()]
    result = BenchResult(
        num_prompts,
        input_len,
        output_len,
        elapsed,
        out_tokens,
        out_tokens / elapsed,
        (sum(in_lens) + out_tokens) / elapsed,
        percentile(ttft, 50),
        percentile(ttft, 90),
        percentile(latency, 50),
        percentile(latency, 90),
        engine.scheduler.num_preemptions - preempted_before,
        steps,
        engine.stats.num_async_steps - overlapped,
        None if math.isinf(request_rate) else request_rate,
        range_ratio=range_ratio,
        input_tokens=sum(in_lens),
    )
    if engine.drafter is not None:
        result.draft_tokens = engine.stats.num_draft_tokens - drafted
        result.accepted_tokens = engine.stats.num_accepted_tokens - accepted
        steps = engine.stats.num_verifications - verified
        result.acceptance_rate = result.accepted_tokens / max(result.draft_tokens, 1)
        result.mean_accepted_length = 1 + result.accepted_tokens / max(steps, 1)
    return result
