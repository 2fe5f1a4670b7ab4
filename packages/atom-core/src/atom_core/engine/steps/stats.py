"""Counters of the engine's steps, for tests, benchmarks and the server's liveness check."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class StepStats:
    consecutive_failures: int = 0  # forwards that failed in a row (a caller may decide the engine is dead)
    num_async_steps: int = 0  # steps launched while the one before was still in flight
    num_draft_tokens: int = 0  # speculative tokens verified, over all requests
    num_accepted_tokens: int = 0  # of those, accepted
    num_verifications: int = 0  # sequence-steps that verified drafts
