"""No single request or client can stall `atom serve`: each attack runs beside a good request (the probe),
whose latency must stay within a small bound of its latency alone.

The attacks: stop strings and stop token ids at (and past) their limits, a chat of 200,000 empty messages,
a streaming client that stops reading, and SIGTERM with streams and whole answers in flight.
"""

import json
import signal
import socket
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from core_fixtures.network import closed_within

from atom_core.engine.sampling_params import MAX_STOP_CHARS, MAX_STOP_STRING_CHARS, MAX_STOP_TOKEN_IDS

BUFFERED = 256  # --max-stream-buffer-tokens
STALL = 4  # --request-timeout: also how long a client may read nothing of its response
ARGS = [
    "--request-timeout",
    str(STALL),
    "--max-num-seqs",
    "64",
    "--num-kv-blocks",
    "2048",
    "--max-request-bytes",
    str(8 * 2**20),
    "--max-stream-buffer-tokens",
    str(BUFFERED),
    "--shutdown-timeout",
    "3",
]


@pytest.fixture(scope="module")
def server(start_server):
    server = start_server(ARGS)
    _probe(server)  # warm up
    server.alone = statistics.median(_probe(server) for _ in range(5))
    return server


def _post(server, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(f"{server.base}{path}", json=body, timeout=timeout)


def _probe(server) -> float:
    """Seconds for a short greedy completion."""
    start = time.monotonic()
    r = _post(server, "/v1/completions", {"prompt": "hello", "max_tokens": 4, "temperature": 0})
    assert r.status_code == 200, r.text
    return time.monotonic() - start


def _probe_beside(server, attack) -> tuple[float, object]:
    """The probe's latency (the worst of three) while attack() runs, and attack's result."""
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(attack)
        time.sleep(0.3)  # the attack is in the engine
        worst = max(_probe(server) for _ in range(3))
        return worst, running.result(timeout=120)


def _assert_unhindered(server, latency: float) -> None:
    assert latency < 3 * server.alone + 1.0, (
        f"probe {latency:.2f} s beside the attack, {server.alone:.2f} s alone"
    )


def _rss(server) -> int:
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) * 1024


def test_the_most_stop_strings_allowed_cost_each_step_only_its_new_text(server):
    # the longest stop strings, as many as the total allows, never completed: each step walks its new
    # characters once (checking every prefix of every stop, as before, took seconds a step)
    count = MAX_STOP_CHARS // MAX_STOP_STRING_CHARS
    stops = [f"{i:04d}" + "z" * (MAX_STOP_STRING_CHARS - 4) for i in range(count)]
    body = {"prompt": "tell me", "max_tokens": 64, "n": 16, "ignore_eos": True, "stop": stops}
    latency, r = _probe_beside(server, lambda: _post(server, "/v1/completions", body))
    assert r.status_code == 200, r.text
    assert all(c["finish_reason"] == "length" for c in r.json()["choices"])
    _assert_unhindered(server, latency)


@pytest.mark.parametrize(
    "field, value, words",
    [
        ("stop", "z" * 2**20, "stop has a string of 1048576 characters"),
        ("stop", ["zz"] * 100_000, "stop has 100000 strings"),
        ("stop", ["z" * 1000] * 20, "stop has 20000 characters in all"),
        ("stop_token_ids", list(range(1_000_000)), "stop_token_ids has 1000000 ids"),
    ],
)
def test_stops_past_their_limits_are_refused_naming_the_field(server, field, value, words):
    body = {"prompt": "x", "max_tokens": 2, field: value}
    latency, r = _probe_beside(server, lambda: _post(server, "/v1/completions", body))
    assert r.status_code == 400, r.text
    assert words in r.json()["error"]["message"]
    _assert_unhindered(server, latency)


def test_the_most_stop_token_ids_allowed_cost_nothing_per_step(server):
    ids = list(range(100_000, 100_000 + MAX_STOP_TOKEN_IDS))  # never sampled: the vocabulary is smaller
    body = {"prompt": "go", "max_tokens": 64, "n": 4, "ignore_eos": True, "stop_token_ids": ids}
    latency, r = _probe_beside(server, lambda: _post(server, "/v1/completions", body))
    assert r.status_code == 200, r.text
    _assert_unhindered(server, latency)


def test_a_chat_of_200000_empty_messages_is_refused_without_stalling_the_server(server):
    body = {"messages": [{"role": "user", "content": ""}] * 200_000, "max_tokens": 2}
    # encoded here, once: the probes below wait on nothing of this process's (encoding 6 MB holds its GIL)
    payload = json.dumps(body).encode()
    headers = {"content-type": "application/json"}

    def attack() -> tuple[httpx.Response, float]:
        """The attack beside /health probes: its answer and the slowest probe's seconds."""
        health = []
        with ThreadPoolExecutor(1) as pool:
            url = f"{server.base}/v1/chat/completions"
            running = pool.submit(httpx.post, url, content=payload, headers=headers, timeout=60)
            while not running.done():  # /health answers while the body is parsed and refused
                start = time.monotonic()
                assert httpx.get(f"{server.base}/health", timeout=10).status_code == 200
                health.append(time.monotonic() - start)
            return running.result(), max(health)

    # three attacks, judged by their median: a server that parses on its event loop stalls every one of
    # them, while one pause of a loaded 2-core machine (seconds, once) decides nothing
    slowest = []
    for _ in range(3):
        r, worst = attack()
        assert r.status_code == 400, r.text
        assert "messages" in r.json()["error"]["message"] and "at most 4096" in r.json()["error"]["message"]
        slowest.append(worst)
    assert statistics.median(slowest) < 1.0, f"/health took {sorted(slowest)} s while bodies were parsed"


def _sse_request(port: int, body: dict, rcvbuf: int = 4096) -> socket.socket:
    """A streaming request on a raw socket with a small receive buffer, whose answer is never read."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    sock.connect(("127.0.0.1", port))
    payload = json.dumps(body).encode()
    head = (
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock.sendall(head + payload)
    return sock


def _wait_for_requests(server, count: int) -> None:
    """Until the engine holds `count` requests (those just sent are admitted)."""
    deadline = time.monotonic() + 30
    while httpx.get(f"{server.base}/health", timeout=10).json()["requests"] < count:
        assert time.monotonic() < deadline, f"fewer than {count} requests reached the engine"
        time.sleep(0.05)


def test_a_stream_whose_client_stops_reading_is_dropped_and_its_memory_freed(server):
    before = _rss(server)
    # top-20 logprobs: ~1 kB a token, far more than the sockets between client and server buffer
    body = {
        "prompt": "go on",
        "max_tokens": 1000,
        "n": 16,
        "logprobs": 20,
        "ignore_eos": True,
        "stream": True,
    }
    sock = _sse_request(server.port, body)
    try:
        _wait_for_requests(server, 1)
        deadline = time.monotonic() + 60
        while httpx.get(f"{server.base}/health", timeout=10).json()["requests"] > 0:
            assert time.monotonic() < deadline, "the request kept running for a client that reads nothing"
            time.sleep(0.2)
        # 16 samples of 1000 tokens were asked for; the request stopped soon after the bound was passed
        assert "client stopped reading" in server.log()
        _assert_unhindered(server, _probe(server))
        # and the connection, whose response task waits for a client that reads nothing, is cut
        deadline = time.monotonic() + STALL + 5
        while "read nothing of its response" not in server.log():
            assert time.monotonic() < deadline, "the stalled connection was kept"
            time.sleep(0.2)
        assert closed_within(sock, 10)  # what the kernel still held, then the end
    finally:
        sock.close()
    grown = _rss(server) - before
    assert grown < 64 * 2**20, f"the server grew by {grown / 2**20:.0f} MiB"


def _stream_lines(server, body: dict) -> list[str]:
    with httpx.stream("POST", f"{server.base}/v1/completions", json=body, timeout=60) as r:
        assert r.status_code == 200
        return [line for line in r.iter_lines() if line]


def test_sigterm_ends_streams_with_an_error_event_and_whole_answers_with_503(start_server):
    busy = start_server(ARGS)
    long = {"prompt": "keep going", "max_tokens": 1000, "n": 8, "ignore_eos": True, "temperature": 0.8}
    with ThreadPoolExecutor(4) as pool:
        streams = [pool.submit(_stream_lines, busy, {**long, "stream": True}) for _ in range(2)]
        wholes = [pool.submit(_post, busy, "/v1/completions", long) for _ in range(2)]
        _wait_for_requests(busy, 4)
        start = time.monotonic()
        busy.proc.send_signal(signal.SIGTERM)
        code = busy.proc.wait(timeout=30)
        took = time.monotonic() - start
        for lines in (s.result() for s in streams):
            assert lines[-1] == "data: [DONE]"
            error = json.loads(lines[-2].removeprefix("data: "))["error"]
            assert error["code"] == 503 and "shutting down" in error["message"], error
        for r in (w.result() for w in wholes):
            assert r.status_code == 503, r.text
            assert "shutting down" in r.json()["error"]["message"]
    assert code == 0
    assert took < 3 + 3, f"exit took {took:.1f} s for a 3 s shutdown timeout"
    assert "Traceback" not in busy.log(), busy.log()


def test_a_second_sigterm_ends_the_requests_at_once(start_server):
    busy = start_server([*ARGS[:-1], "30"])  # a shutdown timeout the test must not wait for
    long = {"prompt": "keep going", "max_tokens": 1000, "n": 8, "ignore_eos": True, "stream": True}
    with ThreadPoolExecutor(1) as pool:
        stream = pool.submit(_stream_lines, busy, long)
        _wait_for_requests(busy, 1)
        busy.proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)
        start = time.monotonic()
        busy.proc.send_signal(signal.SIGTERM)
        assert busy.proc.wait(timeout=20) == 0
        assert time.monotonic() - start < 5
        assert stream.result()[-1] == "data: [DONE]"
    assert "Traceback" not in busy.log(), busy.log()


def test_a_penalty_at_the_edge_of_fp32_gives_finite_logprobs_through_the_openai_client(server):
    from openai import OpenAI

    client = OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0)
    fields = {"repetition_penalty": 1e-39}
    whole = client.completions.create(
        model="atom-demo", prompt="again and again", max_tokens=6, logprobs=5, extra_body=fields
    )
    lps = whole.choices[0].logprobs
    assert all(-9999.0 <= lp <= 0 for lp in lps.token_logprobs)
    assert all(-9999.0 <= lp <= 0 for top in lps.top_logprobs for lp in top.values())
    chunks = client.completions.create(
        model="atom-demo", prompt="again and again", max_tokens=6, logprobs=5, stream=True, extra_body=fields
    )
    streamed = [
        lp
        for c in chunks
        for lp in (c.choices[0].logprobs.token_logprobs if c.choices and c.choices[0].logprobs else [])
    ]
    assert len(streamed) == 6 and all(-9999.0 <= lp <= 0 for lp in streamed)
