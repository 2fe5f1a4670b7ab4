"""The speculative-decoding options, as vLLM users spell them ({"method": "mtp", "num_speculative_tokens": k});
torch-free, so the command line builds its parser without importing the engine."""

from __future__ import annotations

import json
from dataclasses import dataclass

METHODS = {"mtp": "mtp", "deepseek_mtp": "mtp"}  # vLLM's names -> the one ATOM implements
MAX_SPECULATIVE_TOKENS = 8
_FIELDS = ("method", "num_speculative_tokens")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str  # "mtp": the checkpoint's multi-token-prediction layer drafts
    num_speculative_tokens: int  # k: tokens drafted per step (the one MTP layer applied k times)

    @classmethod
    def parse(cls, value: SpeculativeConfig | dict | str | None) -> SpeculativeConfig | None:
        """From what a user gives, as vLLM spells it: {"method": "mtp", "num_speculative_tokens": k}, or the
        same as a JSON string (the command line). Raises ValueError naming what is wrong."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as err:
                raise ValueError(f"speculative_config is not valid JSON: {err}") from None
        if not isinstance(value, dict):
            raise ValueError(f"speculative_config must be a dict, got {type(value).__name__}")
        unknown = sorted(set(value) - set(_FIELDS))
        if unknown:
            raise ValueError(
                f"speculative_config field(s) {', '.join(unknown)} are not supported (supported: {', '.join(_FIELDS)})"
            )
        method = value.get("method")
        if method not in METHODS:
            raise ValueError(
                f"speculative method {method!r} is not supported (supported: {', '.join(sorted(METHODS))})"
            )
        k = value.get("num_speculative_tokens")
        if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k <= MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"num_speculative_tokens must be an integer from 1 to {MAX_SPECULATIVE_TOKENS}, got {k!r}"
            )
        return cls(METHODS[method], k)

    def to_dict(self) -> dict:
        return {"method": self.method, "num_speculative_tokens": self.num_speculative_tokens}
