"""Async scheduling: the engine launches decode step k+1 before the host has read step k's tokens.

A decode step's host work (scheduling, input building, reading the sampled tokens, stop checks and
detokenization, outputs) otherwise sits between two forwards with the GPU idle. Here step k's greedy
tokens are taken on the device (ModelRunner keeps the argmax of a step that asks for it), step k+1's
input ids are filled from them on the device (`feed_sampled`), and the tokens travel to the host in a
non-blocking copy (`InFlightStep`) that the engine reads after it has launched k+1. Outputs arrive one
step later; a sequence that stops at step k's token has one more token computed and dropped.

The engine takes this path only where the next step is known without step k's tokens: every running
sequence greedy (no logprobs, no penalties) and continuing by one token, no request waiting, no
preemption, no speculative draft and no state layers (llm_engine.LLMEngine._continues). Anything else
settles the step in flight first and runs as before.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from atom_core.engine.sampling_params import SamplingParams
from atom_core.engine.sequence import Sequence


def sampled_on_device(params: SamplingParams) -> bool:
    """Whether a request's next token is its logits' argmax and nothing else (what the device computes)."""
    return params.greedy and params.logprobs is None and not params.penalized


def feed_sampled(ids: torch.Tensor, rows: list[int], sources: list[int], sampled: torch.Tensor) -> None:
    """ids[rows] = sampled[sources], on the device: the tokens of the last step, never read by the host.

    ids: [T] int64 token ids of this step; sampled: [R] int64, the last step's argmax per logits row."""
    n = len(rows)
    if rows == list(range(n)) and sources == list(range(n)):  # nothing finished since: one copy
        ids[:n].copy_(sampled[:n])
        return
    to = torch.tensor(rows, dtype=torch.long, device=ids.device)
    ids[to] = sampled[torch.tensor(sources, dtype=torch.long, device=ids.device)]


class HostTokens:
    """Two pinned host buffers the in-flight steps' tokens are copied into, used in turn: the buffer a
    step is read from is written again only two launches later, after that read."""

    def __init__(self, max_rows: int, device: torch.device):
        pin = device.type == "cuda"
        self.buffers = [torch.zeros(2 * max_rows, dtype=torch.int64, pin_memory=pin) for _ in range(2)]
        self.events = [torch.cuda.Event() if pin else None for _ in range(2)]
        self.turn = 0

    def take(self, rows: int) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        i, self.turn = self.turn, 1 - self.turn
        return self.buffers[i][: 2 * rows].view(2, rows), self.events[i]


@dataclass(slots=True)
class InFlightStep:
    """A launched decode step: its sampled sequences (one per logits row) and their tokens on the way."""

    seqs: list[Sequence]
    host: torch.Tensor  # [2, R] int64: the greedy token, and 1 where the row's logits were all finite
    done: torch.cuda.Event | None

    @classmethod
    def launch(cls, seqs: list[Sequence], greedy: torch.Tensor, buffers: HostTokens) -> InFlightStep:
        """Start copying greedy ([2, R] int64: the tokens, and 1 where a row's logits were all finite; the
        model runner's) to the host; returns at once."""
        host, done = buffers.take(len(seqs))
        host.copy_(greedy, non_blocking=done is not None)
        if done is not None:
            done.record()
        return cls(seqs, host, done)

    def read(self) -> tuple[list[int], list[int]]:
        """Wait for the copy; returns (tokens, finite flags), one per row."""
        if self.done is not None:
            self.done.synchronize()
        tokens, finite = self.host.tolist()
        return tokens, finite
