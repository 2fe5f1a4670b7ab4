"""Chat messages -> prompt token ids through the checkpoint's chat template, with message text kept text.

A message may contain the spelling of a control token ("</s>", "<|im_end|>"): tokenizing the rendered
template as one string would turn it into that control token, letting a user end a turn or forge one.
When any message holds such a spelling, the template is rendered around placeholders and each message's
text is tokenized on its own with special tokens split into ordinary text; otherwise the rendered text
is tokenized whole, exactly as transformers' apply_chat_template(tokenize=True) does.
"""

from __future__ import annotations

import re
from pathlib import Path

from atom_core.config import ConfigError

_MARK = "\ue000{}\ue001"  # private-use characters around a message's index
_SPLIT = re.compile("\ue000(\\d+)\ue001")


# what the template call itself sets: a request's template arguments may not name them
RESERVED_TEMPLATE_ARGS = frozenset(
    {"conversation", "messages", "chat_template", "tokenize", "add_generation_prompt", "return_dict"}
)


def chat_prompt_ids(
    tokenizer,
    messages: list[dict[str, str]],
    template: str | None = None,
    *,
    add_generation_prompt: bool = True,
    template_kwargs: dict | None = None,
    tools: list[dict] | None = None,
) -> list[int]:
    """messages: [{"role", "content"}] -> the prompt's token ids, with a generation prompt appended (unless
    add_generation_prompt is False). template: Jinja text used instead of the tokenizer's own chat template;
    template_kwargs: variables the template reads (vLLM's chat_template_kwargs, e.g. enable_thinking);
    tools: the functions offered ([{"type": "function", "function": {...}}]), as templates take them. A
    message's content may be None (an assistant's tool calls)."""
    extra = dict(template_kwargs or {})
    if reserved := sorted(RESERVED_TEMPLATE_ARGS & set(extra)):
        raise ValueError(f"chat_template_kwargs may not set {', '.join(reserved)}")
    if tools:
        extra["tools"] = tools
    if template is None and not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model has no chat template: give one (--chat-template, chat_template=)")
    controls = [t for t in tokenizer.all_special_tokens + list(tokenizer.get_added_vocab()) if t]
    if not any(t in (m.get("content") or "") for m in messages for t in controls):
        text = tokenizer.apply_chat_template(
            messages,
            chat_template=template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt,
            **extra,
        )
        return tokenizer(text, add_special_tokens=False).input_ids
    marked = [{**m, "content": _MARK.format(i)} if m.get("content") else m for i, m in enumerate(messages)]
    rendered = tokenizer.apply_chat_template(
        marked, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt, **extra
    )
    ids: list[int] = []
    for i, piece in enumerate(_SPLIT.split(rendered)):
        if i % 2 == 0:  # the template's own text, control tokens included
            ids += tokenizer(piece, add_special_tokens=False).input_ids if piece else []
        else:
            content = messages[int(piece)]["content"]
            ids += tokenizer(content, add_special_tokens=False, split_special_tokens=True).input_ids
    return ids


def chat_template_text(given: str | Path | None) -> str | None:
    """The chat template an engine was given (vLLM's --chat-template): a file's text, or the Jinja text
    itself; None when none was given. Anything else is refused by name before the model loads."""
    if given is None:
        return None
    path = Path(given).expanduser()
    if len(str(given)) < 4096 and path.is_file():
        return path.read_text()
    if isinstance(given, str) and ("{{" in given or "{%" in given):
        return given
    raise ConfigError(f"chat_template {str(given)[:80]!r}: no such file, and not a Jinja template")
