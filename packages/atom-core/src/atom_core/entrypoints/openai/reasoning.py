"""Reasoning content: a thinking model's `<think>…</think>` part of a chat answer, given apart from its
content (`reasoning_content`, as vLLM's qwen3 and deepseek_r1 reasoning parsers give it), whole or as
it streams.

Whether the answer starts inside a think block is read from the prompt: templates that open it
themselves (Qwen3.5, DeepSeek-R1: the generation prompt ends with `<think>`) leave it open there, those
that close it (Qwen3 with enable_thinking=False: `<think></think>`) do not; otherwise the answer is
reasoning only if it opens with the tag. An answer cut before `</think>` is reasoning throughout."""

from __future__ import annotations

# the parsers vLLM names, by the tags they split at
PARSERS = {"qwen3": ("<think>", "</think>"), "deepseek_r1": ("<think>", "</think>")}
# the architectures a parser is picked for when the tokenizer has both of its tags as tokens
FAMILIES = {"qwen3": ("Qwen3", "Qwen3_5"), "deepseek_r1": ("DeepseekV3",)}
# whole answer formats whose parser also reads content and tool calls (harmony.py), by the families using them
FORMATS = {"harmony": ("GptOss",)}
NAMES = (*PARSERS, *FORMATS)


def default_parser(architecture: str, tokenizer) -> str | None:
    """The parser for this model family, if its tokenizer knows the tags; else None (no split)."""
    from atom_core.entrypoints.openai.harmony import HarmonyVocab

    if architecture.startswith(FORMATS["harmony"]) and HarmonyVocab.of(tokenizer) is not None:
        return "harmony"
    vocab = tokenizer.get_vocab() if tokenizer is not None else {}
    for name, prefixes in FAMILIES.items():
        if architecture.startswith(prefixes) and all(tag in vocab for tag in PARSERS[name]):
            return name
    return None


def opened_in_prompt(prompt_tail: str, parser: str) -> bool:
    """Whether the prompt (its last characters suffice) leaves a think block open."""
    start, end = PARSERS[parser]
    return prompt_tail.rfind(start) > prompt_tail.rfind(end)


class ReasoningSplitter:
    """Splits one answer's text, fed in pieces, into (reasoning, content) pieces; text that may be the
    start of a tag is held until the next piece shows what it is."""

    def __init__(self, parser: str, opened: bool):
        self.start, self.end = PARSERS[parser]
        self.state = "reasoning" if opened else "first"  # first: the answer may still open with the tag
        self.held = ""
        self.after_end = False  # the content right after </think> drops its leading newlines

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        buf, self.held = self.held + text, ""
        reasoning = content = ""
        while buf:
            if self.state == "first":
                stripped = buf.lstrip()
                if stripped.startswith(self.start):
                    buf, self.state = stripped[len(self.start) :], "reasoning"
                elif self.start.startswith(stripped) and not final:  # (it may still become the tag)
                    self.held, buf = buf, ""
                else:
                    self.state = "content"
            elif self.state == "reasoning":
                at = buf.find(self.end)
                if at >= 0:
                    reasoning += buf[:at]
                    buf, self.state, self.after_end = buf[at + len(self.end) :], "content", True
                    continue
                keep = 0 if final else partial_tag(buf, self.end)
                reasoning, self.held, buf = reasoning + buf[: len(buf) - keep], buf[len(buf) - keep :], ""
            else:
                if self.after_end:
                    buf = buf.lstrip("\n")
                    self.after_end = not buf
                content, buf = content + buf, ""
        return reasoning, content


def partial_tag(text: str, tag: str) -> int:
    """How many of text's last characters are the start of tag (held back: they may complete it)."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0


def split_reasoning(text: str, parser: str, opened: bool) -> tuple[str | None, str]:
    """A whole answer's (reasoning or None when it has none, content)."""
    splitter = ReasoningSplitter(parser, opened)
    reasoning, content = splitter.feed(text, final=True)
    return (reasoning if splitter.state != "content" or reasoning or opened else None), content
