"""`atom serve` on a free localhost port, driven by the official openai client; bad requests get 400."""

from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from atom_core.engine import LLM, SamplingParams

KEY = "test-key"


@pytest.fixture(scope="module")
def server(start_server):
    process = start_server(["--api-key", KEY, "--max-model-len", "128", "--num-kv-blocks", "96"])
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
    assert [m.id for m in client.models.list().data] == ["atom-demo"]


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


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"model": "atom-demo"}, "prompt"),
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
