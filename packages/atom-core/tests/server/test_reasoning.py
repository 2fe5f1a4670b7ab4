"""Reasoning content: a thinking model's <think> part apart from its content, on recorded answers (whole,
and streamed in pieces of every size: the pieces join to the whole), the parser picked by model family,
and through the server, where a regex makes the random demo model write a think block."""

import asyncio
import json

import httpx
import pytest

from atom_core.engine import LLMEngine
from atom_core.engine.async_engine import AsyncEngine
from atom_core.engine.config import EngineConfig
from atom_core.entrypoints.openai.app import create_app
from atom_core.entrypoints.openai.reasoning import (
    ReasoningSplitter,
    default_parser,
    opened_in_prompt,
    split_reasoning,
)

RECORDED = [
    # (parser, the prompt's tail, the answer, reasoning, content)
    (
        "qwen3",
        "<|im_start|>assistant\n",
        "<think>\nSum: 2+2.\n</think>\n\nIt is 4.",
        "\nSum: 2+2.\n",
        "It is 4.",
    ),
    ("qwen3", "<|im_start|>assistant\n<think>\n\n</think>\n\n", "It is 4.", None, "It is 4."),  # thinking off
    ("qwen3", "<|im_start|>assistant\n<think>\n", "Sum first.</think>\n\nIt is 4.", "Sum first.", "It is 4."),
    ("qwen3", "<|im_start|>assistant\n<think>\n", "Still thinking when cut", "Still thinking when cut", ""),
    ("qwen3", "<|im_start|>assistant\n", "No tags < here </thin", None, "No tags < here </thin"),
    ("deepseek_r1", "<｜Assistant｜><think>\n", "a < b</think>b > a", "a < b", "b > a"),
    ("deepseek_r1", "<｜Assistant｜>", "<think>x</think>\n\n\ny", "x", "y"),
]


@pytest.mark.parametrize("parser, tail, answer, reasoning, content", RECORDED)
def test_recorded_answers_whole_and_streamed_in_pieces(parser, tail, answer, reasoning, content):
    opened = opened_in_prompt(tail, parser)
    assert split_reasoning(answer, parser, opened) == (reasoning, content)
    for size in range(1, 8):
        splitter, thought, said = ReasoningSplitter(parser, opened), "", ""
        pieces = [answer[i : i + size] for i in range(0, len(answer), size)]
        for i, piece in enumerate(pieces):
            r, c = splitter.feed(piece, final=i == len(pieces) - 1)
            thought, said = thought + r, said + c
        assert (thought, said) == (reasoning or "", content), size


class _Vocab:
    def __init__(self, *tokens):
        self.tokens = {t: i for i, t in enumerate(tokens)}

    def get_vocab(self):
        return self.tokens


def test_the_parser_follows_the_model_family_where_the_tokenizer_has_the_tags():
    tags = _Vocab("<think>", "</think>", "a")
    assert default_parser("Qwen3ForCausalLM", tags) == "qwen3"
    assert default_parser("Qwen3_5MoeForConditionalGeneration", tags) == "qwen3"
    assert default_parser("DeepseekV3ForCausalLM", tags) == "deepseek_r1"
    assert default_parser("LlamaForCausalLM", tags) is None
    assert default_parser("Qwen3ForCausalLM", _Vocab("a")) is None
    assert default_parser("Qwen3ForCausalLM", None) is None


@pytest.fixture(scope="module")
def app(demo):
    engine = LLMEngine(EngineConfig(model=str(demo), device="cpu", kernel_backend="torch", num_kv_blocks=64))
    async_engine = AsyncEngine(engine)
    yield create_app(async_engine, "atom-demo", reasoning_parser="qwen3")
    async_engine.shutdown()
    engine.shutdown()


def _post(app, body):
    async def go():
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client:
            return await client.post("/v1/chat/completions", json=body)

    return asyncio.run(go())


def test_the_server_gives_reasoning_content_whole_and_streamed(app):
    # the regex makes the random model think (three letters) before it answers (three more)
    body = {
        "messages": [{"role": "user", "content": "Think first."}],
        "max_tokens": 40,
        "seed": 3,
        "structured_outputs": {"regex": "<think>[a-z]{3}</think>\n[a-z]{3}"},
        "chat_template_kwargs": {"enable_thinking": True},  # (the demo's template ignores it)
    }
    message = _post(app, body).json()["choices"][0]["message"]
    assert len(message["reasoning_content"]) == 3 and len(message["content"]) == 3
    events = _post(app, {**body, "stream": True}).text.split("\n\n")
    deltas = [json.loads(e[6:])["choices"][0]["delta"] for e in events if e.startswith("data: {")]
    assert "".join(d.get("reasoning_content", "") for d in deltas) == message["reasoning_content"]
    assert "".join(d.get("content") or "" for d in deltas) == message["content"]
    refused = _post(app, {**body, "chat_template_kwargs": {"tokenize": True}})
    assert refused.status_code == 400 and "chat_template_kwargs may not set tokenize" in refused.text
