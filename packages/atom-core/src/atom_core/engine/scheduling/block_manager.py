"""Paged KV blocks with automatic prefix caching.

A full block's identity is (its parent block's identity, its tokens): exact, so equal prefixes share
blocks and different ones never collide. Freed blocks keep their identity until reused, least recently
freed first, so a later request with the same prefix still finds them. The block that holds a sequence's
last known token is never taken from the cache: it is always computed, so shared blocks are never written.
Models with state layers also need the state at the end of the reused prefix: with `snapshots`, a hit
stops at the last block whose state was kept (state_snapshots.py).
"""

from __future__ import annotations

import itertools
from collections import OrderedDict

from atom_core.engine.scheduling.sequence import Sequence
from atom_core.engine.state.state_snapshots import StateSnapshots


class BlockManager:
    """prefix_caching=False: blocks are never shared. snapshots: for models with state layers, the states
    kept at block boundaries; a cached prefix is reused only up to a boundary that has one."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int,
        *,
        prefix_caching: bool = True,
        snapshots: StateSnapshots | None = None,
    ):
        self.block_size = block_size
        self.prefix_caching = prefix_caching
        self.snapshots = snapshots
        self.ref_count = [0] * num_blocks
        self.free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))  # oldest first
        self.key_of: dict[int, tuple] = {}  # block -> its content key, while cached
        self.block_of: dict[tuple, int] = {}  # content key -> block
        self.content_id: dict[int, int] = {}  # block -> id used as the parent of the next block's key
        self._next_content = itertools.count(1)
        self.num_prefix_hits = 0  # blocks reused from the cache (for tests and stats)
        self.num_prefix_queried_tokens = 0  # tokens of the sequences admitted while prefix caching is on

    @property
    def num_free_blocks(self) -> int:
        return len(self.free)

    def _take(self) -> int:
        block, _ = self.free.popitem(last=False)
        if (key := self.key_of.pop(block, None)) is not None:  # evict its cached content
            del self.block_of[key]
            self.content_id.pop(block, None)
            if self.snapshots is not None:
                self.snapshots.drop(key)
        self.ref_count[block] = 1
        return block

    def admit(self, seq: Sequence) -> int:
        """Reuse cached blocks for the longest cached prefix of seq's tokens; returns how many blocks."""
        b = self.block_size
        if self.prefix_caching:  # (the hit rate's denominator: vLLM's prefix_cache_queries)
            self.num_prefix_queried_tokens += len(seq.token_ids)
        parent, hits, keys = 0, [], []
        # never the block of the last token; none for a prompt whose logprobs are read from its forward
        for i in range(0 if seq.scores_prompt else self.cacheable_blocks(seq)):
            key = (parent, tuple(seq.token_ids[i * b : (i + 1) * b]))
            block = self.block_of.get(key)
            if block is None:
                break
            hits.append(block)
            keys.append(key)
            parent = self.content_id[block]
        seq.restore_slot = -1
        if self.snapshots is not None:  # up to the last boundary whose state was kept
            usable = next((i + 1 for i in reversed(range(len(keys))) if self.snapshots.has(keys[i])), 0)
            hits, keys = hits[:usable], keys[:usable]
            if keys:
                seq.restore_slot = self.snapshots.use(keys[-1])
        for block in hits:
            if self.ref_count[block] == 0:
                del self.free[block]
            self.ref_count[block] += 1
        self.num_prefix_hits += len(hits)
        seq.block_table = hits
        seq.num_computed_tokens = len(hits) * b
        seq.num_hashed_blocks = len(hits)
        seq.block_keys = keys
        return len(hits)

    def cacheable_blocks(self, seq: Sequence) -> int:
        """Blocks of seq a later request could take from the cache (all full ones before its last token)."""
        return (len(seq.token_ids) - 1) // self.block_size if self.prefix_caching else 0

    def blocks_needed(self, seq: Sequence, new_tokens: int) -> int:
        return max(0, -(-(seq.num_computed_tokens + new_tokens) // self.block_size) - len(seq.block_table))

    def can_allocate(self, seq: Sequence, new_tokens: int) -> bool:
        return self.blocks_needed(seq, new_tokens) <= len(self.free)

    def allocate(self, seq: Sequence, new_tokens: int) -> None:
        for _ in range(self.blocks_needed(seq, new_tokens)):
            seq.block_table.append(self._take())

    def register_full_blocks(self, seq: Sequence) -> None:
        """After a forward: make seq's newly completed blocks findable by later requests."""
        if not self.prefix_caching:
            return
        b = self.block_size
        # a block is keyed by its token ids: only those the host knows (async scheduling computes one ahead)
        full = min(seq.num_computed_tokens, len(seq.token_ids)) // b
        parent = (
            self.content_id.get(seq.block_table[seq.num_hashed_blocks - 1], 0) if seq.num_hashed_blocks else 0
        )
        for i in range(seq.num_hashed_blocks, full):
            block = seq.block_table[i]
            key = (parent, tuple(seq.token_ids[i * b : (i + 1) * b]))
            if key not in self.block_of and block not in self.key_of:
                self.block_of[key] = block
                self.key_of[block] = key
                self.content_id[block] = next(self._next_content)
            parent = self.content_id.get(self.block_of.get(key, block), 0)
            seq.block_keys.append(key)
        seq.num_hashed_blocks = full

    def release(self, seq: Sequence) -> None:
        for block in reversed(seq.block_table):  # the tail is freed first, so prefixes live longest
            self.ref_count[block] -= 1
            if self.ref_count[block] == 0:
                self.free[block] = None
        seq.block_table = []
        seq.num_computed_tokens = 0
        seq.num_hashed_blocks = 0
        seq.block_keys = []
        seq.restore_slot = -1
