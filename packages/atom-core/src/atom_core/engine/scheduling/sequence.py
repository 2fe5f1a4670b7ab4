"""One generation stream: its tokens, how many are in the KV cache, its blocks, its sampling state."""

from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field

import torch

from atom_core.engine.sampling_params import SamplingParams


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


_ids = itertools.count()


@dataclass(eq=False, slots=True)
class Sequence:
    request_id: str
    index: int  # which of the request's n samples
    prompt_token_ids: list[int]
    params: SamplingParams
    min_tokens_stops: frozenset[int] = frozenset()  # what it may not draw before params.min_tokens (EOS, ...)
    token_ids: list[int] = field(init=False)
    output_token_ids: list[int] = field(default_factory=list)
    output_logprobs: list[dict[int, float]] = field(default_factory=list)
    num_computed_tokens: int = 0  # tokens whose KV is in the cache
    block_table: list[int] = field(default_factory=list)
    num_hashed_blocks: int = 0  # leading full blocks registered for prefix caching
    block_keys: list[tuple] = field(default_factory=list)  # their content keys (prefix caching)
    restore_slot: int = -1  # on admission: the state snapshot its cached prefix resumes from (-1: none)
    state_slot: int = -1  # its row in the state layers' caches while running (models with state layers)
    # under speculation, k more rows: a verify step keeps the state after each draft in one of them
    spare_state_slots: list[int] = field(default_factory=list)
    draft_token_ids: list[int] = field(default_factory=list)  # speculative proposals the next step verifies
    # async scheduling: tokens sampled on the device and already fed to a later step, not yet read by the
    # host (they follow token_ids)
    num_pending: int = 0
    num_drafted: int = 0  # speculative tokens proposed for it, in total
    num_accepted: int = 0  # of those, accepted
    status: Status = Status.WAITING
    finish_reason: str | None = None
    text: str = ""
    arrival: int = field(default_factory=lambda: next(_ids))
    # with its index and an output position, keys the draw of each sampled token (sampler.draw_key)
    sample_seed: int = field(init=False)
    draw_base: int | None = None  # the part of its draws' keys that position does not change (draw_key's)
    detokenizer: object | None = None  # the engine's IncrementalDetokenizer, when it has a tokenizer
    stop_scan: object | None = None  # its StopScan over text (engine/text/stop_strings.py), when it has stops
    # OutputKind.DELTA: the tokens and settled characters its outputs have carried so far
    num_sent_tokens: int = 0
    num_sent_chars: int = 0
    # SamplingParams.prompt_logprobs (the request's first sample only): per prompt position, None for the
    # first, then {token: logprob} of the prompt's token and the top ones, filled as its chunks run
    prompt_logprobs: list[dict[int, float] | None] | None = None
    grammar: object | None = None  # structured outputs: its Matcher (engine/structured/matcher.py)

    def __post_init__(self):
        self.token_ids = list(self.prompt_token_ids)
        seed = self.params.seed
        if seed is None:  # its own random one, from torch's generator: torch.manual_seed repeats a run
            seed = int(torch.randint(-(2**63), 2**63 - 1, (), dtype=torch.int64))
        self.sample_seed = seed % 2**64
        if self.params.prompt_logprobs is not None and self.index == 0:
            self.prompt_logprobs = [None]

    @property
    def scores_prompt(self) -> bool:
        """Whether its prompt still has positions whose logprobs are to be read (its prefix is then
        computed, not taken from the prefix cache)."""
        return self.prompt_logprobs is not None and len(self.prompt_logprobs) < len(self.prompt_token_ids)

    @property
    def num_tokens(self) -> int:
        """Known tokens plus those still on their way from the device (async scheduling)."""
        return len(self.token_ids) + self.num_pending

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed_tokens

    def commit_state(self, accepted: int) -> None:
        """After a verify step that kept the state after each of its tokens in [state_slot, *spares]:
        the state after the last accepted token becomes the sequence's, by renaming the slots."""
        group = [self.state_slot, *self.spare_state_slots]
        self.state_slot = group.pop(accepted)
        self.spare_state_slots = group

    def append(self, token: int, logprobs: dict[int, float] | None) -> None:
        self.token_ids.append(token)
        self.output_token_ids.append(token)
        if logprobs is not None:
            self.output_logprobs.append(logprobs)
