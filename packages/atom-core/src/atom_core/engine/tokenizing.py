"""A checkpoint's tokenizer as the engine uses it: loaded without running the checkpoint's own code, its
end-of-sequence ids, and prompts turned into token ids with a bound on the work a prompt may cost."""

from __future__ import annotations

import functools
from pathlib import Path

from atom_core.config import ConfigError, ModelConfig

Prompt = str | list[int] | dict


class Tokenizing:
    def __init__(self, path: Path, model_config: ModelConfig, max_model_len: int):
        self.tokenizer = load_tokenizer(path)
        self.max_model_len = max_model_len
        found = model_config.generation.get("eos_token_id", model_config.hf.get("eos_token_id"))
        self.eos_token_ids = set(found if isinstance(found, list) else [found] if found is not None else [])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            self.eos_token_ids.add(self.tokenizer.eos_token_id)

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        """(the prompt's text if it was given as text, its token ids)."""
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, list):
            return None, list(prompt)
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass prompts as {'prompt_token_ids': [...]}")
        if len(prompt) > self.max_prompt_chars:  # refused before the tokenizer spends time on it
            raise ValueError(
                f"the prompt has {len(prompt)} characters: more than max_model_len {self.max_model_len} "
                f"tokens of this tokenizer can hold ({self.max_prompt_chars})"
            )
        return prompt, self.tokenizer(prompt).input_ids

    @functools.cached_property
    def max_prompt_chars(self) -> int:
        """No prompt longer than this fits max_model_len tokens: a token covers at most as many characters
        as its longest vocabulary entry (twice that, for normalizers that merge characters)."""
        return 2 * max(map(len, self.tokenizer.get_vocab())) * self.max_model_len


def load_tokenizer(path: Path):
    """The checkpoint's tokenizer, or None when it ships none."""
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")):
        return None
    from transformers import AutoTokenizer

    try:  # never run a checkpoint's own code (auto_map): transformers then refuses instead of asking
        return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
    except (OSError, ValueError) as err:
        raise ConfigError(f"{path}: its tokenizer could not be loaded: {err}") from None
