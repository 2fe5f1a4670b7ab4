"""The serving benchmark's run: random token-id prompts (lengths spread as vLLM's random dataset spreads
them), sent as a Poisson process of request_rate requests a second (or all at once), at most
max_concurrency in flight, each streamed and timed; then the summary. The endpoint is checked first (its
model list, then one short request), so a wrong address or model fails in one line before the run."""

from __future__ import annotations

import asyncio
import math
import random
import sys
import time
from dataclasses import dataclass

import httpx
from tqdm import tqdm

from atom_core.entrypoints.random_lengths import length_bounds
from atom_core.entrypoints.serving_bench.metrics import ServeBenchResult, summarize
from atom_core.entrypoints.serving_bench.stream_request import RequestTiming, stream_completion


@dataclass(slots=True)
class ServeBenchSpec:
    base_url: str  # scheme, host and port (and a path prefix, if the server has one), without /v1
    max_token_id: int  # prompt token ids are drawn from [0, max_token_id): at most the model's vocabulary
    model: str | None = None  # the served model's name (None: the first the endpoint lists)
    endpoint: str = "/v1/completions"
    num_prompts: int = 100
    input_len: int = 1024
    output_len: int = 128
    range_ratio: float = 0.0  # each request's lengths within [len x (1 - r), len x (1 + r)]
    request_rate: float = math.inf  # mean arrivals a second (inf: all at once)
    max_concurrency: int | None = None
    ignore_eos: bool = False  # vLLM's extension: generate output_len tokens even past an end of sequence
    temperature: float = 0.0
    seed: int = 0
    api_key: str | None = None
    percentiles: tuple[float, ...] = (90, 99)  # reported beside the mean and median
    timeout_s: float = 600.0  # a request's longest silence before it counts as failed

    def check(self) -> None:
        if min(self.num_prompts, self.input_len, self.output_len, self.max_token_id) < 1:
            raise ValueError("--num-prompts, --input-len, --output-len and --max-token-id must be at least 1")
        if not 0 <= self.range_ratio < 1:
            raise ValueError(f"--random-range-ratio must be in [0, 1), got {self.range_ratio:g}")
        if not self.request_rate > 0:
            raise ValueError(f"--request-rate must be positive, got {self.request_rate:g}")
        if self.max_concurrency is not None and self.max_concurrency < 1:
            raise ValueError(f"--max-concurrency must be at least 1, got {self.max_concurrency}")
        if not self.base_url.startswith(("http://", "https://")):
            raise ValueError(f"--base-url must start with http:// or https://, got {self.base_url!r}")
        for q in self.percentiles:
            if not 0 < q <= 100:
                raise ValueError(f"--metric-percentiles are in (0, 100], got {q:g}")


def _lengths(mean: int, ratio: float, count: int, rng: random.Random) -> list[int]:
    if ratio == 0:
        return [mean] * count
    low, high = length_bounds(mean, ratio)
    return [rng.randint(low, high) for _ in range(count)]


def _reach_error(url: str, err: httpx.HTTPError) -> ValueError:
    reason = " ".join(str(err).split()) or type(err).__name__
    return ValueError(f"cannot reach {url}: {reason} (is the server up, and is --base-url right?)")


async def _served_model(client: httpx.AsyncClient, spec: ServeBenchSpec) -> str:
    """The model to ask for: spec.model, which the endpoint must list, or the first it lists."""
    url = spec.base_url + "/v1/models"
    try:
        response = await client.get(url)
    except httpx.HTTPError as err:
        raise _reach_error(url, err) from None
    if response.status_code != 200:
        raise ValueError(f"{url} answered {response.status_code}: {' '.join(response.text.split())[:200]}")
    served = [m.get("id") for m in response.json().get("data", [])]
    if spec.model is None:
        if not served:
            raise ValueError(f"{url} lists no model; give --model")
        return served[0]
    if spec.model not in served:
        raise ValueError(
            f"--model {spec.model!r} is not served at {spec.base_url}; it serves: {', '.join(served)}"
        )
    return spec.model


def _payload(model: str, prompt: list[int], max_tokens: int, spec: ServeBenchSpec) -> dict:
    payload = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": spec.temperature}
    if spec.ignore_eos:
        payload["ignore_eos"] = True
    return payload


async def run_serve_bench_async(
    spec: ServeBenchSpec, progress=None, transport: httpx.AsyncBaseTransport | None = None
) -> ServeBenchResult:
    """The benchmark; transport: how requests travel (default: the network; tests pass a mock server)."""
    spec.check()
    rng = random.Random(spec.seed)
    in_lens = _lengths(spec.input_len, spec.range_ratio, spec.num_prompts, rng)
    out_lens = _lengths(spec.output_len, spec.range_ratio, spec.num_prompts, rng)
    prompts = [[rng.randrange(spec.max_token_id) for _ in range(n)] for n in in_lens]
    delays, at = [], 0.0
    for _ in range(spec.num_prompts):
        delays.append(at)
        at += rng.expovariate(spec.request_rate) if math.isfinite(spec.request_rate) else 0.0
    headers = {"Authorization": f"Bearer {spec.api_key}"} if spec.api_key else {}
    limits = httpx.Limits(
        max_connections=spec.max_concurrency or spec.num_prompts, max_keepalive_connections=None
    )
    timeout = httpx.Timeout(spec.timeout_s, connect=10.0)
    url = spec.base_url + spec.endpoint
    async with httpx.AsyncClient(
        headers=headers, limits=limits, timeout=timeout, transport=transport
    ) as client:
        model = await _served_model(client, spec)
        probe = await stream_completion(client, url, _payload(model, prompts[0][:8], 2, spec))
        if not probe.success:
            raise ValueError(f"the first (untimed) request to {url} failed: {probe.error}")
        gate = asyncio.Semaphore(spec.max_concurrency) if spec.max_concurrency else None
        bar = tqdm(
            total=spec.num_prompts,
            unit="req",
            desc="[atom bench-serve]",
            file=progress or sys.stderr,
            dynamic_ncols=True,
        )

        async def one(i: int, start: float) -> RequestTiming:
            await asyncio.sleep(max(0.0, start + delays[i] - time.perf_counter()))
            payload = _payload(model, prompts[i], out_lens[i], spec)
            if gate is None:
                timing = await stream_completion(client, url, payload)
            else:
                async with gate:
                    timing = await stream_completion(client, url, payload)
            bar.update(1)
            return timing

        start = time.perf_counter()
        timings = await asyncio.gather(*(one(i, start) for i in range(spec.num_prompts)))
        duration = time.perf_counter() - start
        bar.close()
    return summarize(
        timings,
        duration_s=duration,
        percentiles=list(spec.percentiles),
        endpoint=url,
        model=model,
        request_rate=None if math.isinf(spec.request_rate) else spec.request_rate,
        max_concurrency=spec.max_concurrency,
    )


def run_serve_bench(spec: ServeBenchSpec, progress=None) -> ServeBenchResult:
    """Run the benchmark (blocking); a spec or endpoint that cannot run raises ValueError in one line.
    progress: where the bar goes (default: stderr)."""
    return asyncio.run(run_serve_bench_async(spec, progress))
