"""`atom serve` on a free localhost port, driven by the official openai client; bad requests get 400."""

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from atom_core.engine import LLM, SamplingParams

KEY = "test-key"


@pytest.fixture(scope="module")
def server(start_server):
    args = ["--api-key", KEY, "--max-model-len", "128", "--num-kv-blocks", "96"]
    process = start_server([*args, "--served-model-name", "atom-demo", "atom-alias"])
    yield process.base, process.log_path.parent
    assert process.stop(timeout=15) == 0  # shuts down cleanly on SIGTERM


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server[0]}/v1", api_key=KEY)


@pytest.fixture(scope="module")
def offline(server, monkeypatch_module):
    monkeypatch_module.setenv("ATOM_CACHE_DIR", str(server[1]))
    return LLM(kernel_backend="torch", num_kv_blocks=64, max_model_len=128)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as mp:
        yield mp


def test_models_and_health(client):
    assert [m.id for m in client.models.list().data] == ["atom-demo", "atom-alias"]


def test_every_served_name_is_asked_for_and_answers_carry_the_first(client, server):
    reply = client.completions.create(model="atom-alias", prompt="names", max_tokens=2)
    assert reply.model == "atom-demo"
    with pytest.raises(openai.NotFoundError, match="this server serves 'atom-demo', 'atom-alias'"):
        client.completions.create(model="other", prompt="names", max_tokens=2)


def test_completion_equals_the_offline_engine_and_streaming_equals_whole(client, offline):
    prompt = "Paged attention keeps the"
    whole = client.completions.create(model="atom-demo", prompt=prompt, max_tokens=12, temperature=0)
    expected = offline.generate(prompt, SamplingParams(temperature=0, max_tokens=12))[0].outputs[0]
    assert whole.choices[0].text == expected.text
    assert whole.usage.completion_tokens == len(expected.token_ids)
    chunks = client.completions.create(
        model="atom-demo", prompt=prompt, max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text


def test_chat_with_the_template_streaming_and_not(client, offline):
    messages = [{"role": "user", "content": "Tell me about paged attention"}]
    whole = client.chat.completions.create(model="atom-demo", messages=messages, max_tokens=10, temperature=0)
    tok = offline.engine.tokenizer
    ids = tok(
        tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True),
        add_special_tokens=False,
    ).input_ids
    expected = offline.generate({"prompt_token_ids": ids}, SamplingParams(temperature=0, max_tokens=10))[0]
    assert whole.choices[0].message.content == expected.outputs[0].text
    stream = client.chat.completions.create(
        model="atom-demo", messages=messages, max_tokens=10, temperature=0, stream=True
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream) == whole.choices[0].message.content


def test_n_choices(client):
    out = client.completions.create(
        model="atom-demo",
        prompt="The quick brown fox",
        max_tokens=6,
        n=2,
        temperature=1.0,
        seed=3,
        extra_body={"ignore_eos": True},
    )
    assert sorted(c.index for c in out.choices) == [0, 1]
    assert all(c.finish_reason == "length" for c in out.choices)


def test_a_list_of_prompts_gets_a_choice_per_prompt_and_sample_streaming_and_not(client, offline):
    """OpenAI's batched completions: strings or token lists; choice i * n + j is prompt i's sample j;
    usage counts every prompt; the stream's text per choice equals the whole answer's."""
    texts = ["Paged attention keeps the", "The quick brown fox"]
    greedy = SamplingParams(temperature=0, max_tokens=6)
    expected = [o.outputs[0] for o in offline.generate(texts, greedy)]
    prompt_ids = [o.prompt_token_ids for o in offline.generate(texts, greedy)]
    for prompt in (texts, prompt_ids):
        whole = client.completions.create(model="atom-demo", prompt=prompt, max_tokens=6, temperature=0, n=2)
        assert [c.index for c in sorted(whole.choices, key=lambda c: c.index)] == [0, 1, 2, 3]
        by_index = {c.index: c.text for c in whole.choices}
        assert [by_index[i] for i in range(4)] == [e.text for e in expected for _ in range(2)]
        assert whole.usage.prompt_tokens == sum(map(len, prompt_ids))
        assert whole.usage.completion_tokens == 2 * sum(len(e.token_ids) for e in expected)
    chunks = list(
        client.completions.create(
            model="atom-demo",
            prompt=texts,
            max_tokens=6,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    streamed = {}
    for chunk in chunks:
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {0: expected[0].text, 1: expected[1].text}
    assert chunks[-1].usage.prompt_tokens == sum(map(len, prompt_ids))


def test_a_bad_prompt_in_a_list_names_it_and_runs_none(server):
    body = {"model": "atom-demo", "prompt": ["fine", "word " * 200], "max_tokens": 4}
    r = httpx.post(
        f"{server[0]}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    )
    assert r.status_code == 400 and r.json()["error"]["message"].startswith("prompt 1: "), r.text
    # the first prompt, admitted before, is dropped with it (by the engine thread, before its next step)
    deadline = time.monotonic() + 10
    while httpx.get(f"{server[0]}/health", timeout=10).json()["requests"] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert httpx.get(f"{server[0]}/health", timeout=10).json()["requests"] == 0


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "atom-demo"}, "prompt"),
        ({"model": "atom-demo", "prompt": ["a"] * 65}, "at most 64 are accepted"),
        ({"model": "atom-demo", "prompt": ["a", "b"], "echo": True}, "echo with a list of prompts"),
        ({"model": "atom-demo", "prompt": "x", "max_tokens": -3}, "max_tokens"),
        ({"model": "atom-demo", "prompt": "x", "temperature": -1}, "temperature"),
        ({"model": "atom-demo", "prompt": "word " * 200, "max_tokens": 8}, "max_model_len"),
        ({"model": "atom-demo", "prompt": [1, 99999]}, "prompt token ids"),
        ({"model": "atom-demo", "prompt": "x", "n": 1000}, "n must be at most"),
    ],
)
def test_bad_requests_get_400_with_a_message(server, body, message):
    r = httpx.post(
        f"{server[0]}/v1/completions", json=body, headers={"Authorization": f"Bearer {KEY}"}, timeout=30
    )
    assert r.status_code == 400
    assert message in r.json()["error"]["message"]


def test_wrong_api_key_is_401(server):
    r = httpx.get(f"{server[0]}/v1/models", headers={"Authorization": "Bearer nope"})
    assert r.status_code == 401


def test_good_requests_finish_while_bad_ones_fail(server, client):
    def good(i):
        return (
            client.completions.create(
                model="atom-demo",
                prompt=f"request {i}",
                max_tokens=8,
                temperature=0,
                extra_body={"ignore_eos": True},
            )
            .choices[0]
            .finish_reason
        )

    def bad(_):
        return httpx.post(
            f"{server[0]}/v1/completions",
            json={"prompt": "x", "top_p": 7},
            headers={"Authorization": f"Bearer {KEY}"},
            timeout=30,
        ).status_code

    with ThreadPoolExecutor(8) as pool:
        goods = [pool.submit(good, i) for i in range(6)]
        bads = [pool.submit(bad, i) for i in range(4)]
        assert [f.result() for f in goods] == ["length"] * 6
        assert [f.result() for f in bads] == [400] * 4
    assert httpx.get(f"{server[0]}/health").status_code == 200


def test_the_startup_block_says_what_is_served_and_where_then_ready(server):
    base, cache = server
    port = base.rsplit(":", 1)[1]
    log = (cache / f"server-{port}.log").read_text()
    block = [line.split("atom.server: ", 1)[1] for line in log.splitlines() if "atom.server: " in line]
    assert block[0].startswith("model atom-demo: LlamaForCausalLM from "), log
    assert re.fullmatch(r"dtype float32, device cpu, weights \d+\.\d KiB a device", block[1]), log
    assert (
        block[2] == "KV cache: 96 blocks of 16 tokens (1536 tokens), max_model_len 128, max_num_seqs 256"
    ), log
    assert block[3] == f"ready: serving atom-demo at {base}/v1", log  # right after the block, once
    assert sum(line.startswith("ready:") for line in block) == 1
    engine = [line.split("atom.engine: ", 1)[1] for line in log.splitlines() if "atom.engine: " in line]
    assert engine.count("CUDA graphs: off (cpu runs eagerly)") == 1, log  # said once, with its reason


def test_memory_sizes_are_given_in_a_unit_that_fits():
    from atom_core.entrypoints.openai.startup import memory_size

    assert [memory_size(n) for n in (512, 304_384, 5 << 20, 3 << 29)] == [
        "512 B",
        "297.2 KiB",
        "5.0 MiB",
        "1.50 GiB",
    ]


def _access_line(server, pattern: str, timeout: float = 20.0) -> str:
    """The first access line of the server's log matching pattern (waited for: a stream's is written
    when it ends)."""
    import re

    base, cache = server
    log = cache / f"server-{base.rsplit(':', 1)[1]}.log"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = [line.split("atom.server: ", 1)[-1] for line in log.read_text().splitlines()]
        found = [line for line in lines if re.fullmatch(pattern, line)]
        if found:
            return found[0]
        time.sleep(0.1)
    raise AssertionError(f"no access line matches {pattern!r}:\n" + "\n".join(lines))


def test_access_lines_give_status_tokens_and_time_streams_included(server, client):
    """One line per request once its answer has ended: a whole answer's and a stream's tokens, and 499
    for a stream whose client left (its status line had said 200)."""
    client_part = r"127\.0\.0\.1:\d+ POST /v1/completions"
    greedy = dict(model="atom-demo", temperature=0, extra_body={"ignore_eos": True})
    whole = client.completions.create(prompt="access, whole", max_tokens=5, **greedy)
    _access_line(
        server,
        rf"{client_part} -> 200 in [\d.]+ ms, {whole.usage.prompt_tokens} prompt \+ 5 completion tokens",
    )
    events = list(client.completions.create(prompt="access, streamed", max_tokens=7, stream=True, **greedy))
    assert events
    _access_line(server, rf"{client_part} -> 200 in [\d.]+ ms, \d+ prompt \+ 7 completion tokens")
    body = {"prompt": "access, left", "max_tokens": 120, "stream": True, "temperature": 0, "ignore_eos": True}
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.stream("POST", f"{server[0]}/v1/completions", json=body, headers=headers) as response:
        assert response.status_code == 200
        next(response.iter_lines())  # one event, then the client goes
    _access_line(server, rf"{client_part} -> 499 in [\d.]+ ms, \d+ prompt \+ \d+ completion tokens")
    assert httpx.get(f"{server[0]}/health").status_code == 200


def test_atom_bench_serve_measures_this_server(server, capsys):
    """The serving benchmark against the server: every request completes with the tokens asked for
    (ignore_eos), its prompt tokens are the server's usage, and each latency has its percentiles."""
    from atom_core.cli import main

    argv = ["bench-serve", "--base-url", server[0], "--api-key", KEY, "--max-token-id", "512", "--json"]
    argv += ["--num-prompts", "6", "--input-len", "12", "--output-len", "6", "--random-range-ratio", "0.5"]
    argv += [
        "--request-rate",
        "50",
        "--max-concurrency",
        "3",
        "--ignore-eos",
        "--metric-percentiles",
        "50,99",
    ]
    assert main(argv) == 0
    result = json.loads(capsys.readouterr().out)
    assert (result["model"], result["completed"], result["failed"]) == ("atom-demo", 6, 0)
    assert 6 * 6 * 0.5 <= result["output_tokens"] <= 6 * 6 * 1.5 and 36 <= result["input_tokens"] <= 108
    assert result["max_concurrency"] == 3 and result["request_rate"] == 50
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert set(result["latency_ms"][metric]) == {"mean", "median", "p50", "p99"}
        assert 0 < result["latency_ms"][metric]["median"] <= result["latency_ms"][metric]["p99"]


def test_echo_with_logprobs_scores_the_prompt_streaming_and_not(client, offline):
    """OpenAI's way to get the prompt's logprobs: its tokens come first in logprobs, the first with none,
    then the completion's; the values are the engine's prompt_logprobs, and a stream gives the same."""
    prompt = "Paged attention keeps the"
    ask = dict(model="atom-demo", prompt=prompt, max_tokens=4, temperature=0, echo=True, logprobs=2)
    whole = client.completions.create(**ask).choices[0]
    (ref,) = offline.generate(
        [prompt], SamplingParams(temperature=0, max_tokens=4, prompt_logprobs=2, logprobs=2)
    )
    ids, scored = ref.prompt_token_ids, ref.prompt_logprobs
    lp = whole.logprobs
    assert whole.text == prompt + ref.outputs[0].text
    assert len(lp.tokens) == len(ids) + 4 and lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    expected = [scored[i][ids[i]] for i in range(1, len(ids))] + [
        d[t] for t, d in zip(ref.outputs[0].token_ids, ref.outputs[0].logprobs, strict=True)
    ]
    assert lp.token_logprobs[1:] == pytest.approx(expected, abs=1e-4)
    assert lp.text_offset[0] == 0 and lp.text_offset[len(ids)] == len(prompt)
    assert all(len(top) >= 2 for top in lp.top_logprobs[1:])
    events = list(client.completions.create(stream=True, **ask))
    streamed = [t for e in events for c in e.choices if c.logprobs for t in c.logprobs.token_logprobs]
    assert streamed[0] is None and streamed[1:] == pytest.approx(lp.token_logprobs[1:], abs=1e-5)
    assert "".join(c.text for e in events for c in e.choices) == whole.text


def _metrics(base: str) -> dict[str, float]:
    """/metrics (no API key: not a /v1 route) as {name{labels}: value}, the labels but model_name."""
    from prometheus_client.parser import text_string_to_metric_families

    response = httpx.get(f"{base}/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    found = {}
    for family in text_string_to_metric_families(response.text):
        for sample in family.samples:
            assert sample.labels.pop("model_name") == "atom-demo"
            labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
            found[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return found


def test_metrics_move_with_the_requests_served(server, client):
    """vLLM's names with an atom: prefix: finished requests by reason, token counters and latency
    histograms move by what two requests did (one whole, one streamed, 5 tokens each); the engine's
    gauges and cache counters are there (aborts and failures: test_request_timing.py)."""
    before = _metrics(server[0])
    greedy = dict(model="atom-demo", temperature=0, max_tokens=5, extra_body={"ignore_eos": True})
    whole = client.completions.create(prompt="metrics, whole", **greedy)
    streamed = list(client.completions.create(prompt="metrics, streamed", stream=True, **greedy))
    assert streamed
    after = _metrics(server[0])

    def moved(name: str) -> float:
        return after[name] - before.get(name, 0.0)

    assert moved("atom:request_success_total{finished_reason=length}") == 2
    assert moved("atom:generation_tokens_total") >= 10
    assert moved("atom:prompt_tokens_total") >= 2 * whole.usage.prompt_tokens - 2
    assert moved("atom:time_to_first_token_seconds_count") == 2
    assert moved("atom:e2e_request_latency_seconds_count") == 2
    assert moved("atom:inter_token_latency_seconds_count") >= 8  # 4 later steps for each of the two
    assert moved("atom:prefix_cache_queries_total") > 0
    assert after["atom:num_requests_running"] == 0 and after["atom:num_requests_waiting"] == 0
    assert 0 <= after["atom:kv_cache_usage_perc"] <= 1
    assert (
        after["atom:time_to_first_token_seconds_bucket{le=+Inf}"]
        == after["atom:time_to_first_token_seconds_count"]
    )


def test_tokenize_and_detokenize_as_vllm_has_them(server, offline):
    """A prompt's ids are the engine's; a chat's are those its completion counts; detokenize inverts;
    bad input is a 400 naming it."""
    base, tokenizer = server[0], offline.get_tokenizer()
    text = "Paged attention keeps the"
    got = httpx.post(f"{base}/tokenize", json={"prompt": text, "return_token_strs": True}).json()
    assert got["tokens"] == tokenizer(text).input_ids and got["count"] == len(got["tokens"])
    assert got["max_model_len"] == 128 and got["token_strs"] == tokenizer.convert_ids_to_tokens(got["tokens"])
    assert httpx.post(f"{base}/detokenize", json={"tokens": got["tokens"]}).json()["prompt"].endswith(text)
    messages = [{"role": "user", "content": "Hello there"}]
    chat = httpx.post(f"{base}/tokenize", json={"messages": messages, "model": "atom-alias"}).json()
    headers = {"Authorization": f"Bearer {KEY}"}
    answer = httpx.post(
        f"{base}/v1/chat/completions", json={"messages": messages, "max_tokens": 1}, headers=headers
    )
    assert chat["count"] == answer.json()["usage"]["prompt_tokens"]
    bare = httpx.post(f"{base}/tokenize", json={"messages": messages, "add_generation_prompt": False}).json()
    assert bare["count"] < chat["count"] and chat["tokens"][: bare["count"]] == bare["tokens"]
    for route, payload, message in [
        ("/tokenize", {"prompt": "x", "messages": messages}, "give either prompt or messages"),
        ("/detokenize", {"tokens": [1, 10**6]}, "tokens must be integers in [0, "),
        ("/tokenize", {"prompt": "x", "model": "other"}, "does not exist"),
    ]:
        refused = httpx.post(f"{base}{route}", json=payload)
        assert refused.status_code in (400, 404) and message in refused.json()["error"]["message"]


TRIP = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1}},
    "required": ["city", "days"],
    "additionalProperties": False,
}


def test_response_format_and_structured_outputs_through_the_openai_client(client):
    """json_schema (n=2, whole and streamed) answers validate; vLLM's structured_outputs choice and regex
    hold; a bad constraint is a 400 naming it, and the server serves on."""
    import jsonschema

    fmt = {"type": "json_schema", "json_schema": {"name": "trip", "schema": TRIP, "strict": True}}
    ask = dict(model="atom-alias", messages=[{"role": "user", "content": "Plan a trip"}], max_tokens=80)
    whole = client.chat.completions.create(n=2, seed=4, response_format=fmt, **ask)
    for choice in whole.choices:
        assert choice.finish_reason in ("stop", "length")
        if choice.finish_reason == "stop":
            jsonschema.validate(json.loads(choice.message.content), TRIP)
    events = list(client.chat.completions.create(seed=4, stream=True, response_format=fmt, **ask))
    streamed = "".join(e.choices[0].delta.content or "" for e in events if e.choices)
    assert streamed == whole.choices[0].message.content  # (same seed, sample 0)
    pick = client.completions.create(
        model="atom-demo",
        prompt="Pick:",
        max_tokens=8,
        extra_body={"structured_outputs": {"choice": ["up", "down"]}},
    )
    assert pick.choices[0].text in ("up", "down") and pick.choices[0].finish_reason == "stop"
    code = client.completions.create(
        model="atom-demo",
        prompt="Code:",
        max_tokens=12,
        extra_body={"structured_outputs": {"regex": r"[A-Z]{2}\d{3}"}},
    )
    assert re.fullmatch(r"[A-Z]{2}\d{3}", code.choices[0].text)
    for extra, message in [
        ({"structured_outputs": {"regex": "(x"}}, "the regex constraint is invalid"),
        (
            {"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}},
            "needs json_schema.schema",
        ),
        ({"response_format": {"type": "json_object"}, "structured_outputs": {"choice": ["a"]}}, "not both"),
    ]:
        with pytest.raises(openai.BadRequestError, match=re.escape(message)):
            client.completions.create(model="atom-demo", prompt="A", max_tokens=3, extra_body=extra)
    assert client.completions.create(model="atom-demo", prompt="A", max_tokens=2).choices[0].text is not None
