"""The one stage every step path ends in (synchronous, asynchronous, speculative): a step's new tokens per
sequence become appended tokens, stop checks, registered blocks and the requests' outputs."""

from __future__ import annotations

from dataclasses import dataclass, field

from atom_core.engine.outputs import RequestOutput
from atom_core.engine.scheduling.block_manager import BlockManager
from atom_core.engine.scheduling.sequence import Sequence, Status
from atom_core.engine.steps.requests import RequestTable
from atom_core.engine.steps.stop_check import StopCheck
from atom_core.engine.structured.masking import accept, accept_first


@dataclass(slots=True)
class Produced:
    """What a step produced for one sequence: its new tokens in order (an accepted draft run, or one
    sampled token) with their logprobs where asked, or why it failed."""

    seq: Sequence
    tokens: list[int] = field(default_factory=list)
    logprobs: list[dict[int, float] | None] | None = None
    error: str | None = None


class Emitter:
    def __init__(self, requests: RequestTable, stop_check: StopCheck, blocks: BlockManager):
        self.requests, self.stop_check, self.blocks = requests, stop_check, blocks

    def emit(self, produced: list[Produced]) -> list[RequestOutput]:
        """apply(), then report(): the step's outputs."""
        return self.report(*self.apply(produced))

    def apply(self, produced: list[Produced]) -> tuple[list[str], dict[str, str]]:
        """Append each sequence's tokens until one stops it (the rest are dropped); returns the advanced
        requests and the failed ones (id: why). Sequences that ended meanwhile (an abort, an earlier
        failure) take nothing."""
        advanced, failed = [], {}
        first = accept_first(
            [
                (item.seq, item.tokens[0])
                for item in produced
                if item.seq.grammar is not None and item.tokens and item.seq.status is Status.RUNNING
            ]
        )
        for item in produced:
            seq = item.seq
            if seq.status is not Status.RUNNING:
                continue
            if item.error is not None:
                failed.setdefault(seq.request_id, item.error)
                continue
            for i, token in enumerate(item.tokens):
                seq.append(token, None if item.logprobs is None else item.logprobs[i])
                if not (first.pop(id(seq)) if i == 0 and id(seq) in first else accept(seq, token)):
                    # (the mask allowed only what it accepts, unless the grammar failed)
                    why = seq.grammar.error or f"token {token} is outside the grammar"
                    failed.setdefault(seq.request_id, f"structured output: {why}")
                    break
                self.blocks.register_full_blocks(seq)  # its blocks are findable by content now
                self.stop_check(seq)
                if seq.status is Status.FINISHED:
                    break
            advanced.append(seq.request_id)
        return advanced, failed

    def report(self, advanced: list[str], failed: dict[str, str]) -> list[RequestOutput]:
        """The failed requests' errors first, then every advanced request's output (a request failed since
        apply() reported its error instead, its new tokens included)."""
        return self.requests.outputs(advanced, failed)
