"""What a request's output must match: vLLM's StructuredOutputsParams (exactly one of its constraints)."""

from __future__ import annotations

import json
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    json: str | dict | None = None  # a JSON schema (its text, or the parsed object)
    regex: str | None = None
    choice: list[str] | None = None  # the output is exactly one of these strings
    grammar: str | None = None  # Lark (a `start` rule) or GBNF / EBNF (a `root` rule)
    json_object: bool = False  # any JSON object

    def __post_init__(self):
        given = [n for n in ("json", "regex", "choice", "grammar") if getattr(self, n) is not None]
        given += ["json_object"] if self.json_object else []
        if len(given) != 1:
            found = ", ".join(given) or "none"
            raise ValueError(
                f"structured outputs take exactly one of json, regex, choice, grammar, json_object (got {found})"
            )
        if self.choice is not None and (
            not self.choice or not all(isinstance(c, str) and c for c in self.choice)
        ):
            raise ValueError("structured outputs' choice must be a non-empty list of non-empty strings")
        for name in ("regex", "grammar"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, str) or not value.strip()):
                raise ValueError(f"structured outputs' {name} must be a non-empty string")
        if isinstance(self.json, str):
            try:
                parsed = json.loads(self.json)
            except ValueError as err:
                raise ValueError(f"structured outputs' json schema is not valid JSON: {err}") from None
            if not isinstance(parsed, dict):
                raise ValueError("structured outputs' json schema must be a JSON object")
        elif self.json is not None and not isinstance(self.json, dict):
            raise ValueError("structured outputs' json must be a JSON schema (an object or its text)")

    @property
    def kind(self) -> str:
        """Which constraint it is (for messages)."""
        if self.json_object:
            return "json_object"
        return next(n for n in ("json", "regex", "choice", "grammar") if getattr(self, n) is not None)
