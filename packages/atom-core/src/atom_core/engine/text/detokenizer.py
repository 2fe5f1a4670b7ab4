"""Incremental detokenization: a sequence's text grows by decoding a few trailing tokens per step.

Decoding the whole output every step costs O(n) per token (O(n^2) per sequence). Here each step decodes
only the tokens since the last emitted text plus the one step of context before them (so a tokenizer's
leading-space and byte-merging rules see their neighbour), and emits the difference. Text that ends in an
incomplete UTF-8 sequence (U+FFFD) is held back until the bytes complete, or until the sequence finishes.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    __slots__ = ("_prefix", "_read", "skip_special_tokens", "text", "tokenizer")

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        self.tokenizer, self.skip_special_tokens = tokenizer, skip_special_tokens
        self.text = ""
        self._prefix = 0  # ids[_prefix:_read] decode to the context before the next emitted text
        self._read = 0  # ids[:_read] are reflected in self.text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens)

    def update(self, ids: list[int], *, final: bool = False) -> str:
        """The text of ids (the whole output so far); final: also emit held-back partial characters."""
        if len(ids) == self._read:
            return self.text
        before = self._decode(ids[self._prefix : self._read])
        after = self._decode(ids[self._prefix :])
        if len(after) > len(before) and (final or not after.endswith(REPLACEMENT)):
            self.text += after[len(before) :]
            self._prefix, self._read = self._read, len(ids)
        return self.text
