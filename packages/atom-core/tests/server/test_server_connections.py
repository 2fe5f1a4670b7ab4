"""`atom serve`'s connections under attack, on localhost: silent sockets held at the cap, and bodies over
the size limit sent whole by ordinary clients.

At --max-connections, idle connections (no byte of a request yet) are closed oldest first to admit new
ones, so a flood of silent sockets reopened as they close does not lock out real clients; idle ones close
after --keep-alive-timeout, a begun request head gets --request-timeout. A body over --max-request-bytes is
read and dropped (up to a bound) before the 413, so clients that send the whole body before reading
(httpx, urllib, the openai client) get the 413 rather than a reset.
"""

import contextlib
import gc
import json
import socket
import statistics
import subprocess
import sys
import time
import urllib.error
import urllib.request

import httpx
import pytest
from core_fixtures.network import SILENT_FLOOD, closed_within

CAP = 40  # --max-connections
KEEP_ALIVE = 1.0  # --keep-alive-timeout
REQUEST_TIMEOUT = 5.0  # --request-timeout
LIMIT = 200_000  # --max-request-bytes
ARGS = [
    "--max-model-len",
    "256",
    "--num-kv-blocks",
    "64",
    "--max-num-seqs",
    "8",
    "--max-request-bytes",
    str(LIMIT),
    "--request-timeout",
    str(REQUEST_TIMEOUT),
    "--keep-alive-timeout",
    str(KEEP_ALIVE),
    "--max-connections",
    str(CAP),
    "--shutdown-timeout",
    "3",
]
# Silent sockets (re)opened a second, at most. A new connection must send its first byte before CAP newer
# ones arrive (connections are closed oldest-idle first): unpaced, this flood reaches ~12,000 a second here,
# ~3 ms, which a Python client's own GC pause can exceed; paced, the test measures the server.
FLOOD_RATE = 1000
BIG = 24_000_000  # well over the limit, and over what socket buffers hold


@pytest.fixture(scope="module")
def server(start_server):
    server = start_server(ARGS)
    assert _complete(server).status_code == 200
    return server


def _complete(server, timeout: float = 30, phases: list | None = None) -> httpx.Response:
    """One short completion on a new connection; `phases` gets httpx's trace events (connect, send,
    response headers...) as (event, seconds since the start), to say where a slow one spent its time."""
    body = {"model": "atom-demo", "prompt": "a good request", "max_tokens": 2, "temperature": 0}
    start = time.monotonic()

    def trace(event: str, info: dict) -> None:
        if phases is not None and event.endswith((".complete", ".failed")):
            phases.append((event.removeprefix("http11."), round(time.monotonic() - start, 3)))

    with httpx.Client(timeout=timeout) as client:
        request = client.build_request(
            "POST", f"{server.base}/v1/completions", json=body, extensions={"trace": trace}
        )
        return client.send(request)


def _assert_413(status: int, payload: bytes) -> None:
    assert status == 413, payload[:300]
    error = json.loads(payload)["error"]
    assert f"larger than {LIMIT} bytes" in error["message"], error
    assert set(error) >= {"message", "type", "code"}


class SilentFlood:
    """silent_flood.py in a subprocess (so that it does not hold the good client's GIL), for a `with`
    block; `reopened` once it has ended."""

    def __init__(self, port: int, count: int, seconds: float, per_second: float):
        self.args = [str(a) for a in (port, count, seconds, per_second)]
        self.seconds, self.reopened = seconds, None

    def __enter__(self):
        self.proc = subprocess.Popen(
            [sys.executable, str(SILENT_FLOOD), *self.args],
            stdout=subprocess.PIPE,
            text=True,
        )
        return self

    def __exit__(self, *exc):
        try:
            out, _ = self.proc.communicate(timeout=self.seconds + 10)
            self.reopened = int(out.strip() or -1)
        finally:
            self.proc.kill()
            self.proc.wait()


@contextlib.contextmanager
def _no_full_gc():
    """This process holds torch's objects: a full collection pauses it ~150 ms, longer than a new connection
    has to send its first byte under the flood (CAP / FLOOD_RATE), so a pause between its connect and its
    send would be the client's failure, not the server's. Frozen, they are not scanned."""
    gc.collect()
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def _good_requests(server, seconds: float) -> tuple[list[float], list[str], list]:
    """Completions one after another for `seconds`: each one's latency, the failures, and the slowest
    one's phases."""
    latencies, failures, slowest = [], [], []
    deadline = time.monotonic() + seconds
    for _ in range(500):
        if time.monotonic() > deadline:
            break
        start, phases = time.monotonic(), []
        try:
            r = _complete(server, timeout=10, phases=phases)
            if r.status_code != 200:
                failures.append(f"{r.status_code}: {r.text[:200]}")
        except httpx.HTTPError as err:
            failures.append(repr(err))
        latencies.append(time.monotonic() - start)
        if latencies[-1] == max(latencies):
            slowest = phases
    return latencies, failures, slowest


def test_silent_sockets_at_the_cap_do_not_lock_out_good_requests(server):
    stream_body = {
        "model": "atom-demo",
        "prompt": "busy",
        "max_tokens": 200,
        "ignore_eos": True,
        "stream": True,
    }
    # a request under way on a connection opened before the flood: never idle, so never closed for it
    with (
        httpx.Client(timeout=30) as busy_client,
        busy_client.stream("POST", f"{server.base}/v1/completions", json=stream_body) as busy,
    ):
        assert busy.status_code == 200
        with SilentFlood(server.port, 2 * CAP, seconds=5, per_second=FLOOD_RATE) as flood, _no_full_gc():
            time.sleep(0.5)  # the flood fills the cap
            latencies, failures, slowest = _good_requests(server, seconds=3.5)
            streamed = "".join(busy.iter_text())
        reopened = flood.reopened
    figures = (
        f"{len(latencies) - len(failures)}/{len(latencies)} served, median {statistics.median(latencies):.2f} s, "
        f"slowest {max(latencies):.2f} s (its phases: {slowest}), {reopened} silent sockets reopened"
    )
    print(figures)  # shown with -s: the attack's figures
    assert reopened >= CAP, f"the flood did not hold the cap: {figures}"
    assert not failures, f"{figures}; first failures: {failures[:3]}"
    # Locked out, a good request is refused (a failure above) or waits on the silent sockets' timers:
    # most would wait for a keep-alive timeout, or one for a request timeout. A single request's latency
    # is not bounded tighter: beside CI's background suites, one once took 4 s while 69 took 40 ms
    # (the figures now say in which phase a slow one spent its time).
    assert len(latencies) >= 5, figures
    assert statistics.median(latencies) < KEEP_ALIVE / 2, figures
    assert max(latencies) < REQUEST_TIMEOUT, figures
    assert streamed.rstrip().endswith("data: [DONE]"), streamed[-300:]


def test_idle_connections_close_after_keep_alive_and_a_begun_head_gets_the_request_timeout(server):
    idle = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    half = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app")
    with idle, half:
        start = time.monotonic()
        assert closed_within(idle, KEEP_ALIVE + 2)
        assert time.monotonic() - start < KEEP_ALIVE + 2
        assert not closed_within(half, max(0.0, KEEP_ALIVE + 2.5 - (time.monotonic() - start)))
        assert closed_within(half, REQUEST_TIMEOUT + 3)
        assert time.monotonic() - start < REQUEST_TIMEOUT + 3


def _big_prompt() -> bytes:
    return json.dumps({"model": "atom-demo", "prompt": "x" * BIG, "max_tokens": 1}).encode()


def test_a_body_over_the_limit_sent_whole_by_httpx_gets_413(server):
    r = httpx.post(
        f"{server.base}/v1/completions",
        content=_big_prompt(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    _assert_413(r.status_code, r.content)
    assert _complete(server).status_code == 200


def test_a_chunked_body_over_the_limit_gets_413(server):
    def chunks():
        body = _big_prompt()
        for i in range(0, len(body), 1 << 20):
            yield body[i : i + (1 << 20)]

    r = httpx.post(
        f"{server.base}/v1/completions",
        content=chunks(),
        headers={"Content-Type": "application/json"},
        timeout=30,
    )
    _assert_413(r.status_code, r.content)
    assert _complete(server).status_code == 200


def test_a_body_over_the_limit_sent_whole_by_urllib_gets_413(server):
    request = urllib.request.Request(
        f"{server.base}/v1/completions",
        data=_big_prompt(),
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=30)
    with refused.value:
        _assert_413(refused.value.code, refused.value.read())
    assert _complete(server).status_code == 200


def test_a_prompt_over_the_limit_from_the_openai_client_gets_413(server):
    import openai

    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key="unused", max_retries=0, timeout=30)
    with pytest.raises(openai.APIStatusError) as refused:
        client.completions.create(model="atom-demo", prompt="x" * BIG, max_tokens=1)
    assert refused.value.status_code == 413
    assert f"larger than {LIMIT} bytes" in str(refused.value)
    assert _complete(server).status_code == 200


@pytest.mark.parametrize(
    "header",
    [
        b"Expect: 100-continue\r\nContent-Length: %d" % BIG,  # the client sends nothing until told to
        b"Content-Length: %d" % (65 * 2**20),  # beyond what is read to be dropped (--max-discard-bytes)
    ],
)
def test_a_body_not_worth_reading_is_answered_at_once(server, header):
    with socket.create_connection(("127.0.0.1", server.port), timeout=REQUEST_TIMEOUT + 3) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%s\r\n\r\n"
            % header
        )
        start, answer = time.monotonic(), b""
        for _ in range(100):  # until the server closes (the answer is a few hundred bytes)
            piece = sock.recv(65536)
            if not piece:
                break
            answer += piece
        # not waiting for the body: a server that did would answer after the request timeout (5 s); half of
        # it leaves room for a loaded machine (CI's background suites) without hiding that wait
        assert time.monotonic() - start < REQUEST_TIMEOUT / 2
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 413 "), head  # and no 100 Continue before it
    _assert_413(413, body[body.index(b"{") : body.rindex(b"}") + 1])  # the one chunk of a chunked body
