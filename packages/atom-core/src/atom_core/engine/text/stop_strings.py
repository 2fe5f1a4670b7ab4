"""Stop strings matched incrementally: each step costs the characters it added, not the stops' size.

A request's stop strings become one Aho–Corasick automaton (built once per request, off the engine's
thread); each sample walks it over its text as the text grows (StopScan). The node a sample stands on
spells the longest suffix of its text that begins some stop string: that is both how much text must be
held back from the client (it may still become a stop) and where the next character continues from.
Walking a character follows at most as many failure links as the node is deep, and a node's depth grows
by at most one per character, so a sample's whole text costs O(its length) over all steps.

Which stop wins: the first to be completed as the text grows, and among those completed at the same
character the longest (the one starting first). This does not depend on how tokens cut the text.
"""

from __future__ import annotations

from collections import deque


class StopStrings:
    """The automaton of one request's stop strings (shared by its samples; read-only once built)."""

    __slots__ = ("_depth", "_fail", "_goto", "_match", "longest")

    def __init__(self, stops: list[str]):
        self._goto: list[dict[str, int]] = [{}]
        self._depth = [0]
        self._match = [0]  # length of the longest stop string that is a suffix of the node's spelling
        for stop in stops:
            self._add(stop)
        self._fail = [0] * len(self._goto)
        self._link()
        self.longest = max(map(len, stops), default=0)

    def _add(self, stop: str) -> None:
        node = 0
        for char in stop:
            nxt = self._goto[node].get(char)
            if nxt is None:
                nxt = len(self._goto)
                self._goto[node][char] = nxt
                self._goto.append({})
                self._depth.append(self._depth[node] + 1)
                self._match.append(0)
            node = nxt
        self._match[node] = len(stop)

    def _link(self) -> None:
        """Failure links breadth first: a node's link is the deepest node spelling a proper suffix of it."""
        order = deque(self._goto[0].values())
        while order:
            node = order.popleft()
            for char, child in self._goto[node].items():
                order.append(child)
                self._fail[child] = self.step(self._fail[node], char) if node else 0
                # a child that ends no stop itself still completes the longest one its link completes
                if not self._match[child]:
                    self._match[child] = self._match[self._fail[child]]

    def step(self, node: int, char: str) -> int:
        while True:
            nxt = self._goto[node].get(char)
            if nxt is not None:
                return nxt
            if node == 0:
                return 0
            node = self._fail[node]

    def depth(self, node: int) -> int:
        return self._depth[node]

    def match(self, node: int) -> int:
        return self._match[node]


class StopScan:
    """One sample's walk over its growing text."""

    __slots__ = ("node", "scanned", "stops")

    def __init__(self, stops: StopStrings):
        self.stops = stops
        self.node = 0
        self.scanned = 0  # characters of the text walked so far

    def feed(self, text: str) -> int:
        """Walk text's new characters (text only grows); the index where the first completed stop string
        starts, or -1 (then the text past `settled(text)` may still become one)."""
        stops, node = self.stops, self.node
        for end in range(self.scanned, len(text)):
            node = stops.step(node, text[end])
            if (length := stops.match(node)) > 0:
                self.node, self.scanned = node, end + 1
                return end + 1 - length
        self.node, self.scanned = node, len(text)
        return -1

    @property
    def held(self) -> int:
        """Characters at the text's end that begin some stop string: not yet safe to report."""
        return self.stops.depth(self.node)
