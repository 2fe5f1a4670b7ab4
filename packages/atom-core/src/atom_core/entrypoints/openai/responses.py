"""Response bodies and stream chunks in OpenAI's shapes: choices, usage, logprobs (completions' and chat's)."""

from __future__ import annotations

import json

from atom_core.engine.outputs import CompletionOutput, RequestOutput
from atom_core.entrypoints.openai.harmony import HarmonyPiece, HarmonyStream, HarmonyVocab, whole_calls
from atom_core.entrypoints.openai.reasoning import ReasoningSplitter, split_reasoning
from atom_core.entrypoints.openai.tool_calls import ToolPlan, ToolStream, read_calls


def error_body(
    status: int,
    message: str,
    kind: str = "invalid_request_error",
    code: str | None = None,
    param: str | None = None,
) -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code or status}}


def usage(out: RequestOutput) -> dict:
    """Of a whole (cumulative or final) output."""
    return usage_counts(len(out.prompt_token_ids), sum(len(c.token_ids) for c in out.outputs))


def usage_counts(prompt: int, completion: int) -> dict:
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class Formatter:
    """Builds one request's bodies; `chat` picks the chat shapes, `echo` prefixes completions with the prompt
    (and with echo_scores, their logprobs with the prompt's: the outputs carry prompt_logprobs)."""

    def __init__(
        self,
        tokenizer,
        model: str,
        request_id: str,
        created: int,
        *,
        chat: bool,
        echo: str = "",
        top_logprobs: int = 0,
        echo_scores: bool = False,
        reasoning: tuple[str, bool] | None = None,
        tools: ToolPlan | None = None,
        harmony: HarmonyVocab | None = None,
    ):
        self.tokenizer, self.model, self.id, self.created = tokenizer, model, request_id, created
        self.chat, self.echo, self.top_logprobs = chat, echo, top_logprobs
        self.echo_scores = echo_scores
        # chat with a reasoning parser: (its name, whether the prompt left a think block open), and each
        # streamed choice's splitter
        self.reasoning = reasoning
        self._splitters: dict[int, ReasoningSplitter] = {}
        self.tools = tools  # chat with tools: how the answer's calls are read (tool_calls.py)
        self._tool_streams: dict[int, ToolStream] = {}
        # chat in the harmony format: each choice's messages read from its tokens (harmony.py)
        self.harmony = harmony
        self._harmony_streams: dict[int, HarmonyStream] = {}

    def _token(self, t: int) -> str:
        return self.tokenizer.decode([t]) if self.tokenizer is not None else str(t)

    def logprobs(
        self, c: CompletionOutput, start: int = 0, text_offset: int = 0, echoed: RequestOutput | None = None
    ) -> dict | None:
        """The logprobs of c's tokens from `start` on (a stream sends each token's once); text_offset: the
        characters of c's text before them. echoed: the output whose prompt this chunk echoes (echo with
        logprobs): its prompt tokens come first, the first with no logprob, as OpenAI and vLLM give them."""
        if c.logprobs is None:
            return None
        ids, lps = c.token_ids[start:], c.logprobs[start:]
        if self.chat:
            return {"content": [self._chat_entry(t, lp) for t, lp in zip(ids, lps, strict=True)]}
        entries = []  # (token's text, its logprob, the top ones, its offset in the choice's text)
        if echoed is not None:  # the echo is the prompt's text: its tokens' offsets count from 0
            at = 0
            for t, lp in zip(echoed.prompt_token_ids, echoed.prompt_logprobs, strict=True):
                entries.append((self._token(t), None if lp is None else lp[t], lp, at))
                at += len(entries[-1][0])
        at = len(self.echo) + text_offset
        for t, lp in zip(ids, lps, strict=True):
            entries.append((self._token(t), lp[t], lp, at))
            at += len(entries[-1][0])
        return {
            "tokens": [e[0] for e in entries],
            "token_logprobs": [e[1] for e in entries],
            "top_logprobs": [
                None if e[2] is None else {self._token(k): v for k, v in e[2].items()} for e in entries
            ],
            "text_offset": [e[3] for e in entries],
        }

    def _chat_entry(self, t: int, lp: dict[int, float]) -> dict:
        def one(k: int, v: float) -> dict:
            token = self._token(k)
            return {"token": token, "logprob": v, "bytes": list(token.encode("utf-8"))}

        # lp holds the top_logprobs best tokens and the sampled one (which may be outside them)
        best = sorted(lp.items(), key=lambda kv: -kv[1])[: self.top_logprobs]
        return {**one(t, lp[t]), "top_logprobs": [one(k, v) for k, v in best]}

    def full(self, out: RequestOutput) -> dict:
        choices = []
        for c in out.outputs:
            echoed = out if self.echo_scores else None
            choice = {
                "index": c.index,
                "finish_reason": c.finish_reason,
                "logprobs": self.logprobs(c, echoed=echoed),
            }
            if self.chat and self.harmony is not None:
                piece = HarmonyStream(self.harmony, self.tokenizer).feed(c.token_ids, final=True)
                choice["message"] = self._harmony_message(piece)
                if choice["message"].get("tool_calls"):
                    choice["finish_reason"] = self._finish_with_calls(c.finish_reason)
            elif self.chat:
                choice["message"] = {"role": "assistant", "content": c.text}
                if self.reasoning is not None:
                    thought, content = split_reasoning(c.text, *self.reasoning)
                    choice["message"].update(content=content, reasoning_content=thought)
                if self.tools is not None:
                    content, calls = read_calls(self.tools, choice["message"]["content"])
                    choice["message"]["content"] = content
                    if calls:
                        choice["message"]["tool_calls"] = calls
                        choice["finish_reason"] = self._finish_with_calls(c.finish_reason)
            else:
                choice["text"] = self.echo + c.text
            choices.append(choice)
        return {
            "id": self.id,
            "object": "chat.completion" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": usage(out),
        }

    def _harmony_fields(self, piece: HarmonyPiece) -> tuple[str, str, list[dict]]:
        """(reasoning, content, calls) as this request takes them: without a reasoning parser the analysis
        is left out; without tools a call's arguments are content (the model called what was not offered)."""
        content, calls = piece.content, piece.calls
        if self.tools is None and calls:
            content += "".join(d["function"]["arguments"] for d in calls)
            calls = []
        return (piece.reasoning if self.reasoning is not None else ""), content, calls

    def _harmony_message(self, piece: HarmonyPiece) -> dict:
        reasoning, content, calls = self._harmony_fields(piece)
        message = {"role": "assistant", "content": content or (None if calls else "")}
        if self.reasoning is not None:
            message["reasoning_content"] = reasoning or None
        if calls:
            message["tool_calls"] = whole_calls(calls)
        return message

    def _finish_with_calls(self, reason: str | None) -> str | None:
        """OpenAI's finish reason for an answer that made calls: tool_calls, unless a named function was
        forced (then the answer simply stopped) or max_tokens cut it."""
        named = self.tools is not None and self.tools.mode == "named"
        return reason if named or reason == "length" else "tool_calls"

    def chunk(self, choices: list[dict], usage_stats: dict | None = None) -> str:
        body = {
            "id": self.id,
            "object": "chat.completion.chunk" if self.chat else "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }
        if usage_stats is not None:
            body["usage"] = usage_stats
        return f"data: {json.dumps(body, allow_nan=False)}\n\n"  # ValueError on NaN or Infinity

    def delta(self, c: CompletionOutput, text: str, first: bool, logprobs: dict | None) -> dict:
        choice = {"index": c.index, "finish_reason": c.finish_reason, "logprobs": logprobs}
        if self.chat and self.harmony is not None:
            delta = {"role": "assistant"} if first else {}
            stream = self._harmony_streams.setdefault(c.index, HarmonyStream(self.harmony, self.tokenizer))
            thought, content, calls = self._harmony_fields(
                stream.feed(c.token_ids, c.finish_reason is not None)
            )
            if c.finish_reason is not None and stream.calls and self.tools is not None:
                choice["finish_reason"] = self._finish_with_calls(c.finish_reason)
            delta.update({"reasoning_content": thought} if thought else {})
            # (header tokens give nothing: an empty content there would join to "" where a whole
            # answer that only called has None)
            delta.update({"content": content} if content or (first and not (thought or calls)) else {})
            delta.update({"tool_calls": calls} if calls else {})
            choice["delta"] = delta
        elif self.chat:
            delta = {"role": "assistant"} if first else {}
            final, thought, content = c.finish_reason is not None, "", text
            if self.reasoning is not None:  # (a piece that may be the start of a tag waits for the next)
                splitter = self._splitters.setdefault(c.index, ReasoningSplitter(*self.reasoning))
                thought, content = splitter.feed(text, final=final)
            calls = []
            if self.tools is not None:
                stream = self._tool_streams.setdefault(c.index, ToolStream(self.tools))
                content, calls = stream.feed(content, final=final)
                if final and stream.calls:
                    choice["finish_reason"] = self._finish_with_calls(c.finish_reason)
            delta.update({"reasoning_content": thought} if thought else {})
            delta.update({"content": content} if content or not (thought or calls) else {})
            delta.update({"tool_calls": calls} if calls else {})
            choice["delta"] = delta
        else:
            choice["text"] = (self.echo if first else "") + text
        return choice
