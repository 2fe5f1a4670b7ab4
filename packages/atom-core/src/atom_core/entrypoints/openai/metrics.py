"""`/metrics` in Prometheus' text format (prometheus-client), named as vLLM names its metrics with an
`atom:` prefix, so dashboards and alerts written for vLLM need only the prefix changed.

Per request (told by the engine as it happens, steps/request_timing.py): requests by finish reason,
prompt and generation tokens, time to first token, inter-token and end-to-end latency. Read from the
engine when scraped: running and waiting requests, KV-cache usage, prefix-cache queries and hits (in
tokens), preemptions, and speculative drafts proposed and accepted. Each app has a registry of its own."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from atom_core.engine.llm_engine import LLMEngine

PREFIX = "atom:"
FINISH_REASONS = ("stop", "length", "abort", "error")
# vLLM's default buckets (seconds), so histograms compare bucket for bucket
# fmt: off
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
               240.0, 480.0, 960.0, 1920.0, 7680.0)
# fmt: on


class ServingMetrics:
    """The server's metrics: a RequestObserver for the engine's requests, and the engine's own state read
    at scrape time. render() is the /metrics body."""

    def __init__(self, engine: LLMEngine, model_name: str):
        self.registry = CollectorRegistry(auto_describe=True)
        labels = {"model_name": model_name}
        r = self.registry

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(PREFIX + name, doc, [*labels, *extra], registry=r)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(PREFIX + name, doc, list(labels), buckets=buckets, registry=r).labels(**labels)

        success = counter("request_success", "Finished requests, by finish reason.", ("finished_reason",))
        self._success = {
            reason: success.labels(**labels, finished_reason=reason) for reason in FINISH_REASONS
        }
        self._prompt = counter("prompt_tokens", "Prompt tokens of the requests that reached a first token.")
        self._prompt = self._prompt.labels(**labels)
        self._generation = counter("generation_tokens", "Tokens generated.").labels(**labels)
        self._ttft = histogram("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self._itl = histogram("inter_token_latency_seconds", "Time between a request's steps.", ITL_BUCKETS)
        self._e2e = histogram("e2e_request_latency_seconds", "Request latency, arrival to end.", E2E_BUCKETS)
        self.registry.register(_EngineState(engine, labels))

    # RequestObserver (steps/request_timing.py), on the engine's thread
    def first_token(self, ttft_s: float, prompt_tokens: int) -> None:
        self._ttft.observe(ttft_s)
        self._prompt.inc(prompt_tokens)

    def new_tokens(self, count: int, since_last_s: float | None) -> None:
        self._generation.inc(count)
        if since_last_s is not None:
            self._itl.observe(since_last_s)

    def finished(self, reason: str, prompt_tokens: int, generation_tokens: int, e2e_s: float) -> None:
        self._success[reason if reason in self._success else "stop"].inc()
        self._e2e.observe(e2e_s)

    def render(self) -> bytes:
        from prometheus_client import generate_latest

        return generate_latest(self.registry)


class _EngineState(Collector):
    """What the engine holds now, read when scraped (plain reads of counters and list lengths: a scrape
    never takes the engine's lock)."""

    def __init__(self, engine: LLMEngine, labels: dict[str, str]):
        self.engine, self.names, self.values = engine, list(labels), list(labels.values())

    def _family(self, kind, name: str, doc: str, value: float) -> Metric:
        family = kind(PREFIX + name, doc, labels=self.names)
        family.add_metric(self.values, value)
        return family

    def collect(self) -> Iterator[Metric]:
        engine, gauge, counter = self.engine, GaugeMetricFamily, CounterMetricFamily
        blocks, stats = engine.scheduler.blocks, engine.stats
        total = len(blocks.ref_count)
        yield self._family(
            gauge, "num_requests_running", "Sequences in the running batch.", len(engine.scheduler.running)
        )
        yield self._family(
            gauge, "num_requests_waiting", "Sequences waiting to be scheduled.", len(engine.scheduler.waiting)
        )
        yield self._family(
            gauge,
            "kv_cache_usage_perc",
            "KV-cache blocks in use (0 to 1).",
            1 - blocks.num_free_blocks / max(total, 1),
        )
        yield self._family(
            counter,
            "prefix_cache_queries",
            "Tokens looked up in the prefix cache.",
            blocks.num_prefix_queried_tokens,
        )
        yield self._family(
            counter,
            "prefix_cache_hits",
            "Tokens found in the prefix cache.",
            blocks.num_prefix_hits * blocks.block_size,
        )
        yield self._family(
            counter,
            "num_preemptions",
            "Sequences preempted (recomputed later).",
            engine.scheduler.num_preemptions,
        )
        if engine.drafter is not None:
            yield self._family(
                counter, "spec_decode_num_draft_tokens", "Draft tokens verified.", stats.num_draft_tokens
            )
            yield self._family(
                counter,
                "spec_decode_num_accepted_tokens",
                "Draft tokens accepted.",
                stats.num_accepted_tokens,
            )
            yield self._family(
                counter,
                "spec_decode_num_drafts",
                "Sequence-steps that verified drafts.",
                stats.num_verifications,
            )
