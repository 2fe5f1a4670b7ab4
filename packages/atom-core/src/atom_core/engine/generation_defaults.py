"""The checkpoint's own sampling defaults (generation_config.json), applied as vLLM applies them.

With `generation_config="auto"` (the default) a request that leaves a sampling field unset takes the
value the checkpoint's generation_config.json gives, where it gives one: temperature, top_p, top_k, min_p,
repetition_penalty, and max_new_tokens as max_tokens. "vllm" ignores the file (SamplingParams' own
defaults); a directory path reads the generation_config.json in it instead. Values are checked once, when
the engine starts: a bad one names the file and the field. transformers' do_sample is not read (vLLM
does not read it either): a temperature in the file applies whatever do_sample says.
"""

from __future__ import annotations

import json
from pathlib import Path

from atom_core.config import ConfigError, ModelConfig
from atom_core.engine.sampling_params import SamplingParams

FILE = "generation_config.json"
# generation_config.json's field -> SamplingParams' field
FIELDS = {
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_new_tokens": "max_tokens",
}


def generation_defaults(model: ModelConfig, source: str) -> dict[str, float | int]:
    """SamplingParams fields and values from the generation config `source` names ("auto": the
    checkpoint's, which ModelConfig read; "vllm": none; else a directory holding one)."""
    if source == "vllm":
        return {}
    if source == "auto":
        return _sampling_fields(model.generation, f"{model.path}/{FILE}")
    path = Path(source).expanduser() / FILE
    if not path.is_file():
        raise ConfigError(f"generation_config {source!r}: no {FILE} there (auto, vllm, or its directory)")
    try:
        data = json.loads(path.read_text())
    except ValueError as err:
        raise ConfigError(f"{path} is not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path} holds a {type(data).__name__}, not an object")
    return _sampling_fields(data, str(path))


def _sampling_fields(data: dict, where: str) -> dict[str, float | int]:
    found = {ours: data[theirs] for theirs, ours in FIELDS.items() if data.get(theirs) is not None}
    if found.get("top_k") == 0:  # transformers' "no top-k"
        found["top_k"] = -1
    try:
        SamplingParams(**found)
    except ValueError as err:
        raise ConfigError(f"{where}: {err}") from None
    return found


def described(defaults: dict[str, float | int]) -> str:
    """The defaults as one log phrase: 'temperature=0.6, top_p=0.95'."""
    return ", ".join(f"{k}={v}" for k, v in defaults.items())
