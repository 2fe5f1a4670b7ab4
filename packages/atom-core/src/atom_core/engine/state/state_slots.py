"""Per-sequence state slots: the memory of layers with StateCacheSpec (GDN), beside the block manager's pages.

A running sequence holds one slot (and under speculation one spare per draft, for the verify step's
per-token states); the slot index addresses the same row of every state layer's cache, as a block id
addresses the same page of every paged layer. A slot is taken when a sequence starts running
and given back when it finishes or is preempted (a preempted sequence is recomputed from its first token,
so its state starts fresh).
"""

from __future__ import annotations


class StateSlots:
    def __init__(self, num_slots: int):
        self.num_slots = num_slots
        self._free = list(range(num_slots - 1, -1, -1))  # lowest index handed out first
        self._held: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    def take(self) -> int:
        if not self._free:
            raise RuntimeError(f"all {self.num_slots} state slots are held")
        slot = self._free.pop()
        self._held.add(slot)
        return slot

    def give_back(self, slot: int) -> None:
        if slot not in self._held:
            raise ValueError(f"state slot {slot} is not held")
        self._held.remove(slot)
        self._free.append(slot)
