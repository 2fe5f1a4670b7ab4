"""Which reasoning and tool-call parsers a server uses: the ones asked for, or (auto) the model family's
reasoning parser where the tokenizer has its tags and the parser for the chat template's own call
format; "none" turns either off."""

from __future__ import annotations

from atom_core.engine.llm_engine import LLMEngine
from atom_core.entrypoints.openai.reasoning import default_parser
from atom_core.entrypoints.openai.tool_formats import template_parser


def chosen_parsers(engine: LLMEngine, reasoning: str, tools: str) -> tuple[str | None, str | None]:
    """(reasoning parser, tool-call parser), each None when off."""
    if reasoning == "auto":
        reasoning = default_parser(engine.model_config.architecture, engine.tokenizer)
    if tools == "auto":
        tools = template_parser(getattr(engine.tokenizer, "chat_template", None))
    return (None if reasoning == "none" else reasoning), (None if tools == "none" else tools)
