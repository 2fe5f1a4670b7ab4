"""The harmony format (GPT-OSS): an answer is a run of messages, each `<|channel|>NAME [to=RECIPIENT]
[<|constrain|>TYPE]<|message|>BODY` ended by `<|end|>`, `<|call|>` or `<|return|>`, the next one opened
by `<|start|>assistant`. The analysis channel is the model's reasoning (`reasoning_content`), the final
channel its answer (`content`), and a commentary message addressed `to=functions.NAME` a call of that
function with the body as its arguments (`tool_calls`); commentary to no one (a preamble) is content.

Read from the token ids, not the text: the markers are special tokens, which detokenizing with
skip_special_tokens drops. Their ids come from the checkpoint's own tokenizer (no vocabulary download);
bodies are decoded with it incrementally (a few tokens of context before the new ones, as detokenizers
do), so a character split over tokens is never cut and a long body is not decoded again each piece."""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass, field

MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|call|>", "<|return|>", "<|constrain|>")
_RECIPIENT = re.compile(r"\bto=(\S+)")


@dataclass(frozen=True, slots=True)
class HarmonyVocab:
    """The marker tokens' ids in a tokenizer that has them all."""

    names: dict[int, str]  # id -> marker

    @classmethod
    def of(cls, tokenizer) -> HarmonyVocab | None:
        """The tokenizer's markers, or None where it lacks any (not a harmony model)."""
        vocab = tokenizer.get_vocab() if tokenizer is not None else {}
        if not all(m in vocab for m in MARKERS):
            return None
        return cls({vocab[m]: m for m in MARKERS})

    def marker(self, token: int) -> str | None:
        return self.names.get(token)


@dataclass(slots=True)
class HarmonyPiece:
    """What a stretch of tokens adds: reasoning text, content text and tool_calls deltas (OpenAI's: a
    call's first delta carries its index, id, type and name)."""

    reasoning: str = ""
    content: str = ""
    calls: list[dict] = field(default_factory=list)


class HarmonyStream:
    """One answer's tokens, fed in pieces (the whole answer at once works the same)."""

    def __init__(self, vocab: HarmonyVocab, tokenizer):
        self.vocab, self.tokenizer = vocab, tokenizer
        self.header: list[int | str] = []  # token ids, and markers by name
        self.in_body = False  # the answer starts in a header: the prompt ends with <|start|>assistant
        self.kind: str | None = None  # "reasoning", "content" or "call"
        self.body: list[int] = []
        self.prefix = self.read = 0  # body tokens: decoding context starts at prefix, given out up to read
        self.calls = 0

    def feed(self, token_ids: list[int], final: bool = False) -> HarmonyPiece:
        piece = HarmonyPiece()
        for token in token_ids:
            marker = self.vocab.marker(token)
            if not self.in_body:
                if marker == "<|message|>":
                    self._open(piece)
                elif marker == "<|start|>":
                    self.header = []
                else:
                    self.header.append(marker or token)
            elif marker in ("<|end|>", "<|call|>", "<|return|>"):
                self._flush(piece, whole=True)
                self.in_body, self.header, self.body, self.prefix, self.read = False, [], [], 0, 0
            elif marker is None:
                self.body.append(token)
        if self.in_body:
            self._flush(piece, whole=final)
        return piece

    def _open(self, piece: HarmonyPiece) -> None:
        """A header is complete: what its message is, and a call's first delta."""
        text = " ".join(
            part if isinstance(part, str) else self.tokenizer.decode(part) for part in _runs(self.header)
        )
        channel = text.split("<|channel|>", 1)[1] if "<|channel|>" in text else ""
        channel_name = (channel.split() or [""])[0]
        recipient = _RECIPIENT.search(text.split("<|constrain|>", 1)[0])
        self.in_body, self.body, self.prefix, self.read = True, [], 0, 0
        if recipient is not None and recipient.group(1).startswith("functions."):
            self.kind = "call"
            name = recipient.group(1).removeprefix("functions.")
            piece.calls.append(
                {
                    "index": self.calls,
                    "id": f"call_{uuid.uuid4().hex[:24]}",
                    "type": "function",
                    "function": {"name": name, "arguments": ""},
                }
            )
            self.calls += 1
        else:
            self.kind = "reasoning" if channel_name == "analysis" else "content"

    def _flush(self, piece: HarmonyPiece, whole: bool) -> None:
        """The body's text not given out yet: the tokens after `read`, decoded after the few before them
        (their text is subtracted), so byte-level tokens join into characters; a trailing partial
        character waits, unless whole."""
        if self.read == len(self.body):
            return
        before = self.tokenizer.decode(self.body[self.prefix : self.read])
        text = self.tokenizer.decode(self.body[self.prefix :])
        if not whole and text.endswith("\ufffd"):
            return
        new = text[len(before) :]
        self.prefix, self.read = self.read, len(self.body)
        if not new:
            return
        if self.kind == "reasoning":
            piece.reasoning += new
        elif self.kind == "call":
            piece.calls.append({"index": self.calls - 1, "function": {"arguments": new}})
        else:
            piece.content += new


def _runs(header: list[int | str]) -> list[list[int] | str]:
    """Header parts: runs of ordinary tokens (decoded together), and markers by name."""
    runs: list[list[int] | str] = []
    for part in header:
        if isinstance(part, str):
            runs.append(part)
        elif runs and isinstance(runs[-1], list):
            runs[-1].append(part)
        else:
            runs.append([part])
    return runs


def whole_calls(deltas: list[dict]) -> list[dict]:
    """A whole answer's tool_calls from its deltas (each call's argument pieces joined)."""
    calls: list[dict] = []
    for delta in deltas:
        if "id" in delta:
            calls.append({k: v for k, v in delta.items() if k != "index"})
            calls[-1]["function"] = dict(delta["function"])
        else:
            calls[delta["index"]]["function"]["arguments"] += delta["function"]["arguments"]
    return calls
