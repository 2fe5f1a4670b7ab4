"""Stop strings matched incrementally (engine/text/stop_strings.py) against a brute-force reference: the same
stop found however the text is cut into steps, the same tail held back, and each step's work bounded by
the characters it added."""

import random

import pytest

from atom_core.engine.sampling_params import (
    MAX_STOP_CHARS,
    MAX_STOP_STRING_CHARS,
    MAX_STOP_STRINGS,
    SamplingParams,
)
from atom_core.engine.text.stop_strings import StopScan, StopStrings


def first_stop(text: str, stops: list[str]) -> int:
    """Where the first stop string completed (growing the text one character at a time) starts; the
    longest of those completed at the same character."""
    for end in range(1, len(text) + 1):
        done = [len(s) for s in stops if text[:end].endswith(s)]
        if done:
            return end - max(done)
    return -1


def held(text: str, stops: list[str]) -> int:
    """The longest tail of text that begins (without completing) some stop string."""
    return max((k for s in stops for k in range(1, len(s)) if text.endswith(s[:k])), default=0)


@pytest.mark.parametrize("seed", range(4))
def test_matches_the_brute_force_reference_however_the_text_is_cut(seed):
    rng = random.Random(seed)
    for _ in range(500):
        stops = [
            "".join(rng.choice("ab c") for _ in range(rng.randint(1, 5))) for _ in range(rng.randint(1, 4))
        ]
        text = "".join(rng.choice("ab cd") for _ in range(rng.randint(0, 30)))
        scan, at, found = StopScan(StopStrings(stops)), 0, -1
        while at < len(text) and found < 0:
            at = min(len(text), at + rng.randint(1, 4))  # a step's new characters
            found = scan.feed(text[:at])
            if found < 0:
                assert scan.held == held(text[:at], stops), (stops, text[:at])
        assert found == first_stop(text, stops), (stops, text)


def test_the_first_completed_wins_and_then_the_longest():
    scan = StopScan(StopStrings(["abcd", "bc"]))
    assert scan.feed("xabcd") == 2  # "bc" completes before "abcd" would
    scan = StopScan(StopStrings(["c", "abc"]))
    assert scan.feed("zabc") == 1  # both complete at "c": the longer, starting first


class CountingStops(StopStrings):
    __slots__ = ("walked",)

    def __init__(self, stops: list[str]):
        self.walked = 0
        super().__init__(stops)

    def step(self, node: int, char: str) -> int:
        self.walked += 1
        return super().step(node, char)


def test_each_step_walks_only_its_new_characters():
    stops = CountingStops(["a" * 1023 + "b", *(f"{i:04d}" + "y" * 1000 for i in range(200))])
    scan, text = StopScan(stops), ""
    for _ in range(500):
        text += "aaaa"
        before = stops.walked
        assert scan.feed(text) == -1
        assert stops.walked - before == 4
    assert scan.held == 1023  # the text ends in the stop's first 1023 characters: not yet reported
    assert scan.feed(text + "b") == len(text) - 1023


def test_sampling_params_bound_the_stops():
    with pytest.raises(ValueError, match=f"stop has {MAX_STOP_STRINGS + 1} strings"):
        SamplingParams(stop=["x"] * (MAX_STOP_STRINGS + 1))
    with pytest.raises(ValueError, match=f"a string of {MAX_STOP_STRING_CHARS + 1} characters"):
        SamplingParams(stop="x" * (MAX_STOP_STRING_CHARS + 1))
    with pytest.raises(ValueError, match=f"stop has {MAX_STOP_CHARS + 1} characters in all"):
        SamplingParams(stop=["x" * MAX_STOP_STRING_CHARS] * (MAX_STOP_CHARS // MAX_STOP_STRING_CHARS) + ["y"])
    with pytest.raises(ValueError, match="stop_token_ids has 1000000 ids"):
        SamplingParams(stop_token_ids=list(range(1_000_000)))
    params = SamplingParams(stop=["ab", "c"], stop_token_ids=[5, 7, 5])
    assert params.stop_token_ids == frozenset({5, 7})
    assert params.stop_strings() is params.stop_strings()  # built once, shared by the samples
