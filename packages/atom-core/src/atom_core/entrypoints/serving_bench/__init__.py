"""`atom bench-serve`: a serving benchmark against any OpenAI-compatible completions endpoint (ATOM's
server or another engine's), reporting what vLLM's `vllm bench serve` reports: throughput, time to first
token, time per output token, inter-token latency and end-to-end latency, with their percentiles."""

from atom_core.entrypoints.serving_bench.metrics import ServeBenchResult, summarize
from atom_core.entrypoints.serving_bench.run import ServeBenchSpec, run_serve_bench
from atom_core.entrypoints.serving_bench.stream_request import RequestTiming, stream_completion

__all__ = [
    "RequestTiming",
    "ServeBenchResult",
    "ServeBenchSpec",
    "run_serve_bench",
    "stream_completion",
    "summarize",
]
