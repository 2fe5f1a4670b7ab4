"""The harmony format (GPT-OSS) read from recorded answers' tokens: analysis as reasoning_content, final as
content, commentary addressed to a function as tool_calls (both header forms), a preamble as content;
whole, and streamed in pieces of every size (characters split over tokens included) that join to the
whole; through the Formatter that builds the server's bodies; the parser picked for GPT-OSS; refusals."""

import re

import pytest

from atom_core.engine.outputs import CompletionOutput, RequestOutput
from atom_core.entrypoints.openai.harmony import MARKERS, HarmonyStream, HarmonyVocab, whole_calls
from atom_core.entrypoints.openai.reasoning import default_parser
from atom_core.entrypoints.openai.responses import Formatter
from atom_core.entrypoints.openai.tool_calls import ToolPlan, tool_plan
from atom_core.entrypoints.openai.tool_formats import template_parser


class ByteTokenizer:
    """Harmony's markers as special tokens, then one token per byte (so characters split over tokens)."""

    def get_vocab(self) -> dict[str, int]:
        return {
            **{m: i for i, m in enumerate(MARKERS)},
            **{f"<0x{b:02X}>": len(MARKERS) + b for b in range(256)},
        }

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        return bytes(i - len(MARKERS) for i in ids if i >= len(MARKERS)).decode("utf-8", errors="replace")

    def ids(self, text: str) -> list[int]:
        """A recorded answer's tokens: markers as theirs, everything else byte by byte."""
        out = []
        for part in re.split("(" + "|".join(map(re.escape, MARKERS)) + ")", text):
            out += [MARKERS.index(part)] if part in MARKERS else [len(MARKERS) + b for b in part.encode()]
        return out


TOK = ByteTokenizer()
VOCAB = HarmonyVocab.of(TOK)
NEXT = "<|end|><|start|>assistant"
RECORDED = [
    # (the answer after the prompt's <|start|>assistant, reasoning, content, [(name, arguments)])
    (
        f"<|channel|>analysis<|message|>User asks 2+2 → 4.{NEXT}<|channel|>final<|message|>It is 4 °C ☀.<|return|>",
        "User asks 2+2 → 4.",
        "It is 4 °C ☀.",
        [],
    ),
    (
        f"<|channel|>analysis<|message|>Need the weather.{NEXT}<|channel|>commentary to=functions.get_weather "
        '<|constrain|>json<|message|>{"city": "Zürich"}<|call|>',
        "Need the weather.",
        "",
        [("get_weather", '{"city": "Zürich"}')],
    ),
    (  # the recipient in the role part of the header, then two calls
        ' to=functions.lookup<|channel|>commentary json<|message|>{"q": 1}<|call|><|start|>assistant to=functions.'
        'lookup<|channel|>commentary json<|message|>{"q": 2}<|call|>',
        "",
        "",
        [("lookup", '{"q": 1}'), ("lookup", '{"q": 2}')],
    ),
    (  # a preamble (commentary to no one) is content, as the final answer is
        f"<|channel|>commentary<|message|>Checking. {NEXT}<|channel|>final<|message|>Done.<|return|>",
        "",
        "Checking. Done.",
        [],
    ),
    ("<|channel|>analysis<|message|>cut while thinking", "cut while thinking", "", []),  # max_tokens
]


def _read(answer: str, size: int | None):
    """(reasoning, content, calls) of the answer fed whole (size None) or in pieces of `size` tokens."""
    ids = TOK.ids(answer)
    stream, reasoning, content, deltas = HarmonyStream(VOCAB, TOK), "", "", []
    pieces = [ids] if size is None else [ids[i : i + size] for i in range(0, len(ids), size)]
    for i, piece in enumerate(pieces):
        got = stream.feed(piece, final=i == len(pieces) - 1)
        reasoning, content, deltas = reasoning + got.reasoning, content + got.content, deltas + got.calls
        assert "\ufffd" not in got.reasoning + got.content, "a character was cut"
    calls = [(c["function"]["name"], c["function"]["arguments"]) for c in whole_calls(deltas)]
    return reasoning, content, calls


@pytest.mark.parametrize(("answer", "reasoning", "content", "calls"), RECORDED)
def test_recorded_answers_whole_and_streamed_in_pieces(answer, reasoning, content, calls):
    assert _read(answer, None) == (reasoning, content, calls)
    for size in range(1, 8):
        assert _read(answer, size) == (reasoning, content, calls), size


AUTO = ToolPlan("auto", parser="harmony")


def _formatter(tools: ToolPlan | None = AUTO) -> Formatter:
    return Formatter(
        TOK, "gpt-oss", "chatcmpl-1", 0, chat=True, reasoning=("harmony", False), tools=tools, harmony=VOCAB
    )


def test_the_servers_bodies_whole_and_streamed():
    answer, reasoning, _, [(name, arguments)] = RECORDED[1]
    ids = TOK.ids(answer)
    out = RequestOutput("r", None, [1, 2], [CompletionOutput(0, "", ids, "stop")], finished=True)
    message = _formatter().full(out)["choices"][0]
    assert message["finish_reason"] == "tool_calls"
    assert message["message"]["reasoning_content"] == reasoning and message["message"]["content"] is None
    (call,) = message["message"]["tool_calls"]
    assert call["function"] == {"name": name, "arguments": arguments} and call["id"].startswith("call_")
    fmt, deltas = _formatter(), []
    for i in range(0, len(ids), 5):
        last = i + 5 >= len(ids)
        piece = CompletionOutput(0, "", ids[i : i + 5], "stop" if last else None)
        deltas.append(fmt.delta(piece, "", first=i == 0, logprobs=None))
    assert deltas[-1]["finish_reason"] == "tool_calls"
    joined = "".join(d["delta"].get("reasoning_content", "") for d in deltas)
    streamed = whole_calls([c for d in deltas for c in d["delta"].get("tool_calls", [])])
    assert joined == reasoning and [c["function"] for c in streamed] == [call["function"]]


def test_without_tools_a_call_is_content_and_without_a_reasoning_parser_analysis_is_left_out():
    answer = RECORDED[1][0]
    out = RequestOutput("r", None, [1], [CompletionOutput(0, "", TOK.ids(answer), "stop")], finished=True)
    fmt = Formatter(TOK, "gpt-oss", "c", 0, chat=True, reasoning=None, tools=None, harmony=VOCAB)
    choice = fmt.full(out)["choices"][0]
    assert choice["message"] == {"role": "assistant", "content": '{"city": "Zürich"}'}
    assert choice["finish_reason"] == "stop"


def test_the_format_is_picked_for_gpt_oss_and_read_for_every_tool_choice():
    assert default_parser("GptOssForCausalLM", TOK) == "harmony"
    assert default_parser("LlamaForCausalLM", TOK) is None
    assert template_parser("{{- '<|start|>assistant<|channel|>final<|message|>' }}") == "harmony"
    # a forced call is a message too (its grammar: test_harmony_constraints.py), read as "auto"'s are
    assert tool_plan([object()], "required", "harmony") == ToolPlan("required", None, "harmony")
    assert tool_plan([object()], "none", "harmony") is None


def test_a_server_asked_for_harmony_without_its_markers_is_refused(tmp_path):
    from atom_core.entrypoints.openai.app import create_app

    class Engine:
        class engine:  # (the AsyncEngine's attribute)
            class tokenizer:
                @staticmethod
                def get_vocab():
                    return {"a": 0}

    with pytest.raises(ValueError, match="tokenizer lacks them"):
        create_app(Engine(), "m", reasoning_parser="harmony")
