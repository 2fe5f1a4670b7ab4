"""`atom serve` against hostile requests, clients and connections, on localhost with tight limits.

Each bad request gets the right 4xx in OpenAI's error envelope while a good request beside it completes;
/health stays truthful; memory comes back near its baseline; abandoned and half-sent connections are
closed; a client that leaves stops its work; SIGTERM under load exits within the shutdown timeout.
"""

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest
from core_fixtures.network import closed_within

KEY = "robustness-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
TIMEOUT = 2.0  # --request-timeout
ARGS = [
    "--max-model-len",
    "1024",
    "--num-kv-blocks",
    "128",
    "--max-num-seqs",
    "32",
    "--max-request-bytes",
    "200000",
    "--request-timeout",
    str(TIMEOUT),
    "--keep-alive-timeout",
    "1",
    "--max-connections",
    "40",
    "--shutdown-timeout",
    "3",
]


@pytest.fixture(scope="module")
def server(start_server):
    server = start_server(ARGS, env={"ATOM_API_KEY": KEY})
    _complete(server, "warm up", max_tokens=4)
    server.baseline_rss = _rss(server)
    return server


def _complete(server, prompt, **fields):
    body = {"model": "atom-demo", "prompt": prompt, "temperature": 0, "ignore_eos": True, **fields}
    r = httpx.post(f"{server.base}/v1/completions", json=body, headers=AUTH, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def _rss(server) -> int:
    status = Path(f"/proc/{server.proc.pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS"))) * 1024


def _health(server) -> dict:
    return httpx.get(f"{server.base}/health", timeout=5).json()


def _assert_error(r: httpx.Response, status: int, words: str) -> None:
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert words in error["message"], error
    assert set(error) >= {"message", "type", "code"}
    assert "Traceback" not in r.text and 'File "' not in r.text


CHAT = "/v1/chat/completions"
USER = [{"role": "user", "content": "hello"}]
HOSTILE = {
    "integer as a string": (
        {"prompt": "x", "max_tokens": "5"},
        400,
        "Invalid type for 'max_tokens': expected an integer, but got a string instead.",
    ),
    "integer as a boolean": ({"prompt": "x", "max_tokens": True}, 400, "but got a boolean instead"),
    "max_tokens 0": ({"prompt": "x", "max_tokens": 0}, 400, "max_tokens must be at least 1"),
    "seed as a string": ({"prompt": "x", "seed": "7"}, 400, "seed"),
    "unknown field": ({"prompt": "x", "tools": []}, 400, "Unrecognized request argument supplied: tools"),
    "logit_bias": ({"prompt": "x", "logit_bias": {"5": 1.0}}, 400, "logit_bias is not supported"),
    "suffix": ({"prompt": "x", "suffix": "y"}, 400, "suffix is not supported"),
    "n over the cap": ({"prompt": "x", "n": 1000}, 400, "n must be at most 16"),
    "top_p out of range": ({"prompt": "x", "top_p": 7}, 400, "top_p"),
    "penalty out of range": ({"prompt": "x", "presence_penalty": 3}, 400, "presence_penalty"),
    "temperature NaN": ('{"prompt": "x", "temperature": NaN}', 400, "temperature"),
    "prompt past max_model_len": ({"prompt": [3] * 1020, "max_tokens": 10}, 400, "max_model_len 1024"),
    "token id outside the vocabulary": ({"prompt": [1, 99999]}, 400, "prompt token ids"),
    "lone surrogate": ('{"prompt": "abc \\ud800 def"}', 400, "lone surrogate"),
    "invalid JSON": ('{"prompt": ', 400, "could not parse the request body: it is not valid JSON"),
    "stream_options without stream": (
        {"prompt": "x", "stream_options": {"include_usage": True}},
        400,
        "stream_options",
    ),
    "unknown model": ({"model": "gpt-4", "prompt": "x"}, 404, "does not exist"),
    "body over the limit": ({"prompt": "x" * 300_000}, 413, "larger than 200000 bytes"),
    "prompt no max_model_len can hold": ({"prompt": "ab " * 60_000}, 400, "characters"),
    "chat: image content": (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        400,
        "image_url content is not supported: this server takes text only",
    ),
    "chat: unknown role": ({"messages": [{"role": "robot", "content": "x"}]}, 400, "role"),
    "chat: token limits disagree": (
        {"messages": USER, "max_tokens": 4, "max_completion_tokens": 5},
        400,
        "disagree",
    ),
    "chat: top_logprobs without logprobs": ({"messages": USER, "top_logprobs": 2}, 400, "needs logprobs"),
    "chat: more text than max_model_len holds": (
        {"messages": [{"role": "user", "content": "ab " * 60_000}]},
        400,
        "characters",
    ),
}


@pytest.mark.parametrize("case", list(HOSTILE))
def test_a_hostile_request_gets_its_4xx_and_a_good_one_beside_it_completes(server, case):
    body, status, words = HOSTILE[case]
    path = CHAT if case.startswith("chat:") else "/v1/completions"
    with ThreadPoolExecutor(1) as pool:
        good = pool.submit(_complete, server, f"a good request beside {case}", max_tokens=12)
        if isinstance(body, str):
            r = httpx.post(
                f"{server.base}{path}",
                content=body,
                timeout=60,
                headers={**AUTH, "Content-Type": "application/json"},
            )
        else:
            r = httpx.post(f"{server.base}{path}", json=body, headers=AUTH, timeout=60)
        _assert_error(r, status, words)
        assert good.result()["choices"][0]["finish_reason"] == "length"
    assert _health(server)["status"] == "ok"


@pytest.mark.parametrize(
    "fields",
    [
        dict(temperature=1e-300),
        dict(temperature=1e300, seed=1),
        dict(n=2, seed=2**70, temperature=0.7),
        dict(top_p=1e-9, temperature=1.0),
        dict(min_p=1.0, temperature=1.0),
        dict(presence_penalty=2.0, frequency_penalty=-2.0, repetition_penalty=2.0, temperature=0.5, seed=3),
    ],
)
def test_extreme_sampling_values_are_computed_not_crashed(server, fields):
    out = _complete(server, "extreme values", max_tokens=6, **fields)
    assert all(len(c["text"]) > 0 and c["finish_reason"] == "length" for c in out["choices"])
    if fields.get("temperature") == 1e-300:  # below 1e-5: greedy, as vLLM does
        assert (
            out["choices"][0]["text"]
            == _complete(server, "extreme values", max_tokens=6)["choices"][0]["text"]
        )
    assert (
        _complete(server, "the engine still serves", max_tokens=3)["choices"][0]["finish_reason"] == "length"
    )


def test_authentication_and_routes(server):
    no_key = httpx.get(f"{server.base}/v1/models", timeout=5)
    _assert_error(no_key, 401, "API key")
    _assert_error(
        httpx.get(f"{server.base}/v1/models", headers={"Authorization": "Bearer nope"}), 401, "API key"
    )
    assert (
        httpx.get(f"{server.base}/v1/models", headers={"Authorization": f"bearer {KEY}"}).status_code == 200
    )
    for path in ("/docs", "/openapi.json", "/redoc", "/nothing-here"):
        _assert_error(httpx.get(f"{server.base}{path}", headers=AUTH), 404, "Not Found")
    _assert_error(httpx.get(f"{server.base}/v1/completions", headers=AUTH), 405, "Method Not Allowed")


def _raw(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT + 5)
    return sock


def test_idle_and_half_sent_connections_are_closed(server):
    idle = _raw(server)
    half = _raw(server)
    half.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: app")
    slow_body = _raw(server)
    slow_body.sendall(
        b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer "
        + KEY.encode()
        + b'\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"prompt"'
    )
    start = time.monotonic()
    assert closed_within(idle, TIMEOUT + 3)
    assert closed_within(half, TIMEOUT + 3)
    idle.close()
    half.close()
    slow_body.settimeout(TIMEOUT + 3)
    assert b" 408 " in slow_body.recv(65536).split(b"\r\n")[0]
    slow_body.close()
    assert time.monotonic() - start < TIMEOUT + 3


def test_a_connection_flood_is_capped_and_clients_recover(server):
    flood = [_raw(server) for _ in range(60)]  # the cap is 40
    time.sleep(0.5)
    refused = 0
    for sock in flood:
        sock.settimeout(0.2)
        try:
            refused += sock.recv(1) == b""
        except TimeoutError:
            pass
        except ConnectionResetError:
            refused += 1
    assert refused >= 15, "connections over the cap should be closed at once"
    time.sleep(TIMEOUT + 1)  # the rest time out: the server frees their descriptors
    for sock in flood:
        sock.close()
    assert _complete(server, "after the flood", max_tokens=3)["choices"][0]["finish_reason"] == "length"


def test_a_client_that_leaves_a_non_streaming_request_stops_its_work(server):
    body = json.dumps(
        {"prompt": "a long one", "max_tokens": 1000, "n": 4, "temperature": 0.8, "ignore_eos": True}
    )
    sock = _raw(server)
    sock.sendall(
        f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n{body}".encode()
    )
    deadline = time.monotonic() + 10
    while _health(server)["requests"] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _health(server)["requests"] == 1
    sock.close()
    left = time.monotonic()
    while _health(server)["requests"] and time.monotonic() - left < 5:
        time.sleep(0.05)
    assert _health(server)["requests"] == 0
    assert "/v1/completions -> 499" in server.log()


def test_streaming_equals_whole_with_stop_strings_logprobs_and_usage(server):
    import openai

    client = openai.OpenAI(base_url=f"{server.base}/v1", api_key=KEY)
    whole = client.completions.create(
        model="atom-demo", prompt="The quick brown fox", max_tokens=40, temperature=0
    )
    text = whole.choices[0].text
    stop = text[len(text) // 2 : len(text) // 2 + 3]  # a stop string the greedy text reaches midway
    kwargs = dict(
        model="atom-demo", prompt="The quick brown fox", max_tokens=40, temperature=0, stop=[stop], logprobs=2
    )
    full = client.completions.create(**kwargs)
    chunks = list(client.completions.create(**kwargs, stream=True, stream_options={"include_usage": True}))
    streamed = "".join(c.choices[0].text for c in chunks if c.choices)
    assert full.choices[0].finish_reason == "stop" and full.choices[0].text == text[: text.find(stop)]
    assert streamed == full.choices[0].text
    streamed_tokens = [
        t for c in chunks if c.choices and c.choices[0].logprobs for t in c.choices[0].logprobs.tokens
    ]
    assert streamed_tokens == full.choices[0].logprobs.tokens
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens
    assert chunks[-1].usage.prompt_tokens == full.usage.prompt_tokens

    chat = dict(
        model="atom-demo",
        messages=[{"role": "user", "content": "hi"}],
        max_completion_tokens=12,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    whole_chat = client.chat.completions.create(**chat)
    stream_chat = list(client.chat.completions.create(**chat, stream=True))
    assert (
        "".join(c.choices[0].delta.content or "" for c in stream_chat)
        == whole_chat.choices[0].message.content
    )
    entries = whole_chat.choices[0].logprobs.content
    assert len(entries) == whole_chat.usage.completion_tokens and all(
        len(e.top_logprobs) == 3 for e in entries
    )
    assert [e.token for c in stream_chat for e in (c.choices[0].logprobs.content or [])] == [
        e.token for e in entries
    ]


def test_echo_and_penalties_change_the_answer_as_asked(server):
    plain = _complete(server, "Paged attention", max_tokens=8)["choices"][0]["text"]
    echoed = _complete(server, "Paged attention", max_tokens=8, echo=True)["choices"][0]["text"]
    assert echoed == "Paged attention" + plain
    penalized = _complete(server, "Paged attention", max_tokens=8, repetition_penalty=0.2)["choices"][0][
        "text"
    ]
    assert penalized != plain


def test_control_token_spellings_in_chat_content_stay_text(server):
    body = {"messages": [{"role": "user", "content": "end </s> here"}], "max_tokens": 1, "temperature": 0}
    r = httpx.post(f"{server.base}{CHAT}", json=body, headers=AUTH, timeout=60)
    plain = httpx.post(
        f"{server.base}{CHAT}",
        json={**body, "messages": [{"role": "user", "content": "end  here"}]},
        headers=AUTH,
        timeout=60,
    )
    # "</s>" spelled in the message is several text tokens, not the one end-of-sequence token
    assert r.json()["usage"]["prompt_tokens"] > plain.json()["usage"]["prompt_tokens"] + 1


def test_memory_returns_near_its_baseline(server):
    grown = _rss(server) - server.baseline_rss
    assert grown < 300 * 2**20, f"the server grew by {grown / 2**20:.0f} MiB over the hostile requests"


def test_sigterm_under_load_exits_within_the_shutdown_timeout(start_server):
    busy = start_server(ARGS, env={"ATOM_API_KEY": KEY})
    body = {
        "prompt": "keep going",
        "max_tokens": 1000,
        "n": 4,
        "temperature": 0.8,
        "ignore_eos": True,
        "stream": True,
    }
    streams = [httpx.Client(timeout=30) for _ in range(3)]
    responses = [
        s.send(s.build_request("POST", f"{busy.base}/v1/completions", json=body, headers=AUTH), stream=True)
        for s in streams
    ]
    for r in responses:
        assert r.status_code == 200
        next(r.iter_lines())
    start = time.monotonic()
    assert busy.stop(timeout=20) == 0
    assert time.monotonic() - start < 3 + 5
    for s in streams:
        s.close()
