"""Snapshots of per-sequence state (GDN conv and recurrent state) at block boundaries: what lets a model
with state layers reuse a cached prefix.

A cached prefix's KV blocks resume the attention layers, but a state layer needs its state after the
prefix's last token, which the running slot no longer holds once the sequence moved on. So the scheduler
ends a prefill chunk at the boundary a later request can hit (the last full block before the prompt's
last token; any chunk that ends on a boundary is kept too), and the step copies the state there into a
snapshot slot, keyed by that block's content key. A request whose prefix hits the cache reuses the blocks
up to the last boundary that has a snapshot, and starts from a copy of it.

Snapshot slots are extra rows of the state caches, after the running sequences' slots; they are evicted
with their block (when the block manager reuses it for other content) or, when all are held, least
recently used first; a chunk end on the way to the prompt's last boundary is kept only in a free slot,
so it never displaces a snapshot a repeated prompt would hit.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable


class StateSnapshots:
    def __init__(self, slots: Iterable[int]):
        self._free = list(slots)[::-1]
        self.num_slots = len(self._free)
        self._slot_of: OrderedDict[tuple, int] = OrderedDict()  # block content key -> slot, oldest use first
        self.num_evicted = 0  # snapshots given up for newer ones (for tests and stats)

    def __len__(self) -> int:
        return len(self._slot_of)

    def has(self, key: tuple) -> bool:
        return key in self._slot_of

    def use(self, key: tuple) -> int:
        """The slot holding the state after the block with this key (now most recently used)."""
        self._slot_of.move_to_end(key)
        return self._slot_of[key]

    def reserve(self, *, evict: bool = True) -> int | None:
        """A slot to save a state into (evict: the least recently used snapshot goes when none is free);
        None when there is none."""
        if self._free:
            return self._free.pop()
        if evict and self._slot_of:
            self.num_evicted += 1
            return self._slot_of.popitem(last=False)[1]
        return None

    def commit(self, key: tuple, slot: int) -> None:
        """A reserved slot now holds the state after the block with this key (an equal one already kept
        makes it redundant: the slot is freed)."""
        if key in self._slot_of:
            self._free.append(slot)
        else:
            self._slot_of[key] = slot

    def release(self, slot: int) -> None:
        """Give back a reserved slot that was not written (or whose block was not registered)."""
        self._free.append(slot)

    def drop(self, key: tuple) -> None:
        """The block with this key was reused for other content: its snapshot goes with it."""
        slot = self._slot_of.pop(key, None)
        if slot is not None:
            self._free.append(slot)
