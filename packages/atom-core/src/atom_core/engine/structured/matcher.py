"""One sequence's place in its grammar: llguidance's matcher, plus the request's own stop tokens.

llguidance ends a grammar with the tokenizer's EOS only; a request may also stop on other ids (its
stop_token_ids, a model's several EOS ids). Once the grammar is complete, those are allowed too, and
drawing one ends the output as the grammar's EOS would."""

from __future__ import annotations

import torch


class Matcher:
    __slots__ = ("_stopped_by", "inner", "stops")

    def __init__(self, inner, stops: frozenset[int]):
        self.inner = inner  # llguidance.LLMatcher
        self.stops = stops
        self._stopped_by: int | None = None

    def fill(self, bitmask: torch.Tensor, row: int) -> None:
        """Write the tokens allowed next into bitmask[row] (int32 [B, ceil(V / 32)] on the host, bit t of
        the row: token t allowed)."""
        view = bitmask[row]
        self.inner.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * view.element_size())
        self.allow_stops(bitmask, row)

    def allow_stops(self, bitmask: torch.Tensor, row: int) -> None:
        """Add the request's stop tokens to a filled row once the grammar may end (after a batch fill)."""
        if self.stops and self.inner.is_accepting():
            for token in self.stops:
                if token < 32 * bitmask.shape[1]:
                    word = token >> 5
                    bitmask[row, word] = _as_int32(int(bitmask[row, word]) | (1 << (token & 31)))

    def accept(self, token: int) -> bool:
        """Advance by the drawn token; False if the grammar does not allow it (see error)."""
        return self.ends_with(token) or self.inner.consume_token(token)

    def ends_with(self, token: int) -> bool:
        """Whether token is one of the request's stop tokens and the grammar may end here: the output
        ends with it (the grammar is not advanced)."""
        if token in self.stops and self.inner.is_accepting():
            self._stopped_by = token
            return True
        return False

    @property
    def ended(self) -> bool:
        """Nothing more to mask: a stop token ended the output, or the grammar stopped (complete or failed)."""
        return self._stopped_by is not None or self.inner.is_stopped()

    def is_terminated(self) -> bool:
        """The output is complete: a stop token ended it, or the grammar admits nothing more."""
        return self._stopped_by is not None or (self.inner.is_stopped() and not self.inner.is_error())

    @property
    def error(self) -> str:
        """Why the grammar refused the output so far ("" if it did not)."""
        return self.inner.get_error() if self.inner.is_error() else ""


def _as_int32(value: int) -> int:
    return value - (1 << 32) if value >= 1 << 31 else value
