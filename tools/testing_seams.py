"""The seam tests' recorder: which of atom-core's stateful step functions a surface's layers call, and with
which view of their engine's state.

Every surface (the native backend, atom-vllm, atom-sglang) only translates its engine's metadata into a
view and calls atom-core's step (gdn_step, mla_step); the tests wrap those names where the surface's
modules look them up, run an engine step, and read what reached core. A surface that composed kernel ops
of its own would record nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterable
from types import ModuleType

STEP_FUNCTIONS = ("gdn_step", "mla_step")


def step_kind(name: str, args: tuple) -> str:
    """'mla_step', or 'gdn_step:<view class>' (a GDNStepView that keeps each token's state: '+step_slots')."""
    if name != "gdn_step":
        return name
    view = args[-1]
    kind = type(view).__name__
    if getattr(view, "step_slots", None) is not None:
        kind += "+step_slots"
    return f"{name}:{kind}"


def record_steps(
    modules: Iterable[ModuleType], calls: Counter, patch: Callable[[object, str, object], None] = setattr
) -> Counter:
    """Wrap each step function the modules call (by module global), counting calls by step_kind into
    calls. patch: setattr, or pytest's monkeypatch.setattr (undone after the test)."""
    for module in modules:
        for name in STEP_FUNCTIONS:
            inner = getattr(module, name, None)
            if inner is None:
                continue

            def spy(*args, _name=name, _inner=inner, **kwargs):
                calls[step_kind(_name, args)] += 1
                return _inner(*args, **kwargs)

            patch(module, name, spy)
    return calls
