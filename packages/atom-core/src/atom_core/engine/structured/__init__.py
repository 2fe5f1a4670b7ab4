"""Structured outputs: a request's output held to a JSON schema, JSON, a regex, a choice or a grammar by
masking, before each draw, the tokens its grammar does not allow (llguidance, one of the two grammar
engines vLLM and SGLang offer)."""

from atom_core.engine.structured.grammars import Grammars
from atom_core.engine.structured.params import StructuredOutputsParams

__all__ = ["Grammars", "StructuredOutputsParams"]
