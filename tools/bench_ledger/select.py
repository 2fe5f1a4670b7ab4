"""Paths into a benchmark's result: dot-separated keys, where a list is indexed by `[field=value,...]`
(the first item whose fields equal those values, compared as text) or by `[N]`; "A / B" is the ratio of
two paths' values (a speed-up from two times). A leading `[field=value,...]` applies to the result itself:
its fields must match (a benchmark whose records differ by model)."""

from __future__ import annotations

import re

_STEP = re.compile(r"([^.\[]+)((?:\[[^\]]*\])*)")


class MissingMetric(LookupError):
    """The path names something the result does not hold."""


def _matches(item: object, selector: str) -> bool:
    wanted = dict(part.split("=", 1) for part in selector.split(","))
    return isinstance(item, dict) and all(str(item.get(k)) == v for k, v in wanted.items())


def _match(items: list, selector: str):
    if selector.isdigit():
        return items[int(selector)]
    for item in items:
        if _matches(item, selector):
            return item
    raise MissingMetric(f"no item with {selector}")


def pick(result: object, path: str) -> object:
    """The value at `path` in result; MissingMetric naming the first step that is not there."""
    if " / " in path:
        top, bottom = (pick(result, part.strip()) for part in path.split(" / ", 1))
        if not isinstance(top, int | float) or not isinstance(bottom, int | float) or not bottom:
            raise MissingMetric(f"{path}: not a ratio of two numbers")
        return top / bottom
    if root := re.match(r"\[([^\]]*)\]\.?", path):
        if not _matches(result, root.group(1)):
            raise MissingMetric(f"{path}: the result is not one with {root.group(1)}")
        path = path[root.end() :]
    value = result
    for step in _STEP.finditer(path.replace(".[", "[")):
        key, selectors = step.group(1), step.group(2)
        if not isinstance(value, dict) or key not in value:
            raise MissingMetric(f"{path}: no {key!r}")
        value = value[key]
        for selector in re.findall(r"\[([^\]]*)\]", selectors):
            if not isinstance(value, list):
                raise MissingMetric(f"{path}: {key!r} is not a list")
            value = _match(value, selector)
    return value


def declared_not_measured(result: object, path: str) -> str | None:
    """Why the run left path's figure out, where its result says so: a `not_measured` list of items
    like {"model": ..., "why": ...} (a model too big for the device), matched against the path's first
    selector's fields. None where the result declares nothing for it."""
    selector = re.search(r"\[([^\]]*=[^\]]*)\]", path)
    if not isinstance(result, dict) or selector is None:
        return None
    wanted = dict(part.split("=", 1) for part in selector.group(1).split(","))
    for item in result.get("not_measured", []):
        fields = {k: v for k, v in item.items() if k != "why"}
        if fields and all(wanted.get(k) == str(v) for k, v in fields.items()):
            return str(item.get("why", "not measured"))
    return None
