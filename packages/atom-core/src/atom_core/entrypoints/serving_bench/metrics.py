"""A serving benchmark's summary, as vLLM's `vllm bench serve` reports it: request and token throughput
over the whole run, and the mean, median and chosen percentiles of time to first token (TTFT), time per
output token after the first (TPOT, per request), inter-token latency (ITL, every gap between streamed
events of every request) and end-to-end request latency (E2EL)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from atom_core.entrypoints.percentiles import mean, percentile
from atom_core.entrypoints.serving_bench.stream_request import RequestTiming

METRICS = {
    "ttft": "time to first token",
    "tpot": "time per output token",
    "itl": "inter-token latency",
    "e2el": "end-to-end latency",
}


@dataclass(slots=True)
class ServeBenchResult:
    endpoint: str
    model: str
    num_prompts: int
    completed: int
    failed: int
    duration_s: float
    input_tokens: int  # the completed requests' prompt tokens
    output_tokens: int  # and the tokens generated for them
    request_throughput: float  # completed requests a second
    output_throughput: float  # output tokens a second
    total_token_throughput: float  # input + output tokens a second
    request_rate: float | None  # requests a second, Poisson arrivals (None: all at once)
    max_concurrency: int | None  # requests in flight at most (None: no limit)
    # per metric (ttft, tpot, itl, e2el): {"mean": ms, "median": ms, "p50": ms, ...}; absent with no samples
    latency_ms: dict[str, dict[str, float]] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # the distinct failures, each once

    def table(self) -> str:
        rate = "all at once" if self.request_rate is None else f"{self.request_rate:g} requests/s (Poisson)"
        rows = [
            ("endpoint", f"{self.endpoint} (model {self.model})"),
            (
                "arrivals",
                rate
                + ("" if self.max_concurrency is None else f", at most {self.max_concurrency} in flight"),
            ),
            ("successful requests", f"{self.completed} of {self.num_prompts}"),
            ("duration", f"{self.duration_s:.2f} s"),
            ("input / output tokens", f"{self.input_tokens} / {self.output_tokens}"),
            ("request throughput", f"{self.request_throughput:.2f} requests/s"),
            ("output throughput", f"{self.output_throughput:,.1f} tok/s"),
            ("total throughput", f"{self.total_token_throughput:,.1f} tok/s"),
        ]
        for key, name in METRICS.items():
            stats = self.latency_ms.get(key)
            if stats:
                rows.append(
                    (f"{name} ({key.upper()})", ", ".join(f"{k} {v:.2f}" for k, v in stats.items()) + " ms")
                )
        rows += [("failed: " + e, "") for e in self.errors]
        width = max(len(k) for k, v in rows if v)
        return "\n".join(f"{k:<{width}}  {v}".rstrip() for k, v in rows)

    def as_dict(self) -> dict:
        return asdict(self)


def _stats_ms(values_s: list[float], percentiles: list[float]) -> dict[str, float]:
    ms = [v * 1e3 for v in values_s]
    stats = {"mean": mean(ms), "median": percentile(ms, 50)}
    stats.update({f"p{q:g}": percentile(ms, q) for q in percentiles})
    return stats


def summarize(
    timings: list[RequestTiming],
    *,
    duration_s: float,
    percentiles: list[float],
    endpoint: str,
    model: str,
    request_rate: float | None,
    max_concurrency: int | None,
) -> ServeBenchResult:
    """The run's summary from each request's timing (completed and failed ones alike)."""
    done = [t for t in timings if t.success]
    samples = {
        "ttft": [t.ttft_s for t in done],
        "tpot": [t.tpot_s for t in done if t.tpot_s is not None],
        "itl": [gap for t in done for gap in t.itl_s],
        "e2el": [t.latency_s for t in done],
    }
    input_tokens = sum(t.prompt_tokens for t in done)
    output_tokens = sum(t.output_tokens for t in done)
    return ServeBenchResult(
        endpoint=endpoint,
        model=model,
        num_prompts=len(timings),
        completed=len(done),
        failed=len(timings) - len(done),
        duration_s=duration_s,
        input_tokens=input_tokens,
        output_tokens=output_tokens,
        request_throughput=len(done) / duration_s,
        output_throughput=output_tokens / duration_s,
        total_token_throughput=(input_tokens + output_tokens) / duration_s,
        request_rate=request_rate,
        max_concurrency=max_concurrency,
        latency_ms={k: _stats_ms(v, percentiles) for k, v in samples.items() if v},
        errors=list(dict.fromkeys(t.error for t in timings if not t.success)),
    )
