"""Sampling parameters, in the shape vLLM users know; invalid values raise ValueError naming the field.

Stop strings and stop token ids are bounded in number and size (far above what a real client sends), so
that what one request asks the engine to check on every step stays small; the stop strings' automaton is
built once (stop_strings()), on the caller's thread, not the engine's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from atom_core.engine.outputs import OutputKind
from atom_core.engine.structured.params import StructuredOutputsParams
from atom_core.engine.text.stop_strings import StopStrings

# Temperatures below this sample greedily (as vLLM does): dividing logits by less overflows fp32.
SAMPLING_EPS = 1e-5
MAX_STOP_STRINGS = 256
MAX_STOP_STRING_CHARS = 1024  # each
MAX_STOP_CHARS = 16384  # all of a request's together: its automaton has a node a character
MAX_STOP_TOKEN_IDS = 4096


@dataclass(slots=True)
class SamplingParams:
    n: int = 1
    temperature: float = 1.0  # below SAMPLING_EPS (0 included): greedy
    top_p: float = 1.0
    top_k: int = -1  # -1: all tokens
    min_p: float = 0.0
    presence_penalty: float = 0.0  # subtracted once from each token the output already has (OpenAI, vLLM)
    frequency_penalty: float = 0.0  # subtracted per occurrence in the output
    repetition_penalty: float = 1.0  # vLLM's: logits of prompt and output tokens divided (> 0) or multiplied
    seed: int | None = None
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | frozenset[int] = field(default_factory=list)  # kept as a frozenset
    ignore_eos: bool = False
    logprobs: int | None = None  # how many top logprobs to return with each token (0: only the sampled one)
    # before this many output tokens, EOS and stop_token_ids cannot be drawn and stop strings do not stop
    min_tokens: int = 0
    skip_special_tokens: bool = True  # the output's text leaves special tokens out (its token ids keep them)
    include_stop_str_in_output: bool = False  # the text keeps the stop string that ended it
    # vLLM's: per prompt token after the first, its logprob and the top ones given the tokens before it
    # (raw logits: no temperature or penalty); such a request's prefix is computed, never cached
    prompt_logprobs: int | None = None
    # what each output of a running request carries (vLLM's RequestOutputKind): the whole output so far,
    # only what is new since the last one, or nothing until it finishes
    output_kind: OutputKind = OutputKind.CUMULATIVE
    # vLLM's: what the output must match (a JSON schema, JSON, a regex, a choice, a grammar); a dict is
    # taken as StructuredOutputsParams' fields
    structured_outputs: StructuredOutputsParams | None = None
    _stops: StopStrings | None = field(default=None, init=False, repr=False, compare=False)
    _grammar: object | None = field(default=None, init=False, repr=False, compare=False)  # compiled

    def __post_init__(self):
        _integers(self, "n", "top_k", "max_tokens", "min_tokens")
        _booleans(self, "ignore_eos", "skip_special_tokens", "include_stop_str_in_output")
        _integers(self, "seed", "logprobs", "prompt_logprobs", optional=True)
        if isinstance(self.structured_outputs, dict):
            self.structured_outputs = StructuredOutputsParams(**self.structured_outputs)
        elif self.structured_outputs is not None and not isinstance(
            self.structured_outputs, StructuredOutputsParams
        ):
            raise ValueError(
                f"structured_outputs must be StructuredOutputsParams, got {self.structured_outputs!r}"
            )
        _finite(
            self,
            "temperature",
            "top_p",
            "min_p",
            "presence_penalty",
            "frequency_penalty",
            "repetition_penalty",
        )
        checks = [
            (self.n >= 1, "n must be at least 1"),
            (self.temperature >= 0, "temperature must be >= 0"),
            (0 < self.top_p <= 1, "top_p must be in (0, 1]"),
            (self.top_k == -1 or self.top_k >= 1, "top_k must be -1 (off) or >= 1"),
            (0 <= self.min_p <= 1, "min_p must be in [0, 1]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty must be in [-2, 2]"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty must be in [-2, 2]"),
            (0 < self.repetition_penalty <= 2, "repetition_penalty must be in (0, 2]"),
            (self.max_tokens >= 1, "max_tokens must be at least 1"),
            (0 <= self.min_tokens <= self.max_tokens, "min_tokens must be between 0 and max_tokens"),
            (self.logprobs is None or 0 <= self.logprobs <= 20, "logprobs must be between 0 and 20"),
            (
                self.prompt_logprobs is None or 0 <= self.prompt_logprobs <= 20,
                "prompt_logprobs must be between 0 and 20",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise ValueError(message)
        self._check_stops()
        if not isinstance(self.output_kind, OutputKind):
            raise ValueError(f"output_kind must be an OutputKind, got {self.output_kind!r}")

    def _check_stops(self) -> None:
        if isinstance(self.stop, str):
            self.stop = [self.stop]
        if not all(isinstance(s, str) for s in self.stop or []):
            raise ValueError("stop must be a string or a list of strings")
        self.stop = [s for s in (self.stop or []) if s]
        if len(self.stop) > MAX_STOP_STRINGS:
            raise ValueError(f"stop has {len(self.stop)} strings: at most {MAX_STOP_STRINGS} are accepted")
        if (longest := max(map(len, self.stop), default=0)) > MAX_STOP_STRING_CHARS:
            raise ValueError(
                f"stop has a string of {longest} characters: at most {MAX_STOP_STRING_CHARS} are accepted"
            )
        if (total := sum(map(len, self.stop))) > MAX_STOP_CHARS:
            raise ValueError(f"stop has {total} characters in all: at most {MAX_STOP_CHARS} are accepted")
        if len(self.stop_token_ids) > MAX_STOP_TOKEN_IDS:
            raise ValueError(
                f"stop_token_ids has {len(self.stop_token_ids)} ids: at most {MAX_STOP_TOKEN_IDS} are accepted"
            )
        if not all(isinstance(t, int) and not isinstance(t, bool) for t in self.stop_token_ids):
            raise ValueError("stop_token_ids must be integers")
        self.stop_token_ids = frozenset(self.stop_token_ids)  # looked up once per sampled token

    def stop_strings(self) -> StopStrings | None:
        """The stop strings' automaton (None without stop strings), built on first use."""
        if self._stops is None and self.stop:
            self._stops = StopStrings(self.stop)
        return self._stops

    @property
    def greedy(self) -> bool:
        return self.temperature < SAMPLING_EPS

    @property
    def penalized(self) -> bool:
        """Whether its logits are changed from the tokens so far, on the host (penalties.py): penalties,
        and min_tokens' ban on stopping early."""
        return (
            self.presence_penalty != 0
            or self.frequency_penalty != 0
            or self.repetition_penalty != 1
            or self.min_tokens > 0
        )


def _integers(params: SamplingParams, *names: str, optional: bool = False) -> None:
    for name in names:
        value = getattr(params, name)
        if (value is None and optional) or (isinstance(value, int) and not isinstance(value, bool)):
            continue
        raise ValueError(f"{name} must be an integer, got {value!r}")


def _booleans(params: SamplingParams, *names: str) -> None:
    for name in names:
        if not isinstance(value := getattr(params, name), bool):
            raise ValueError(f"{name} must be true or false, got {value!r}")


def _finite(params: SamplingParams, *names: str) -> None:
    for name in names:
        value = getattr(params, name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise ValueError(f"{name} must be a finite number, got {value!r}")
