"""Per-forward state, bound explicitly for the duration of one forward (no process-global mode).

The runner that calls a model binds a ForwardContext with `bind_forward_context`; attention layers read
it with `current_forward_context`. A ContextVar scope means two models in one process (target and draft,
or two engines) each see only the context bound around their own forward.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any


@dataclass(slots=True)
class ForwardContext:
    """metadata: per kind (atom_core.cache's "paged", "state", or an adapter's own key), in the backend's
    own type; caches: per cache index (each layer's `cache_index`), in the backend's own cache type."""

    metadata: Mapping[str, Any]
    caches: Sequence[Any] = ()

    def metadata_for(self, kind: str) -> Any:
        try:
            return self.metadata[kind]
        except KeyError:
            raise RuntimeError(
                f"this forward carries no {kind!r} metadata (it has: {', '.join(self.metadata) or 'none'})"
            ) from None


_CURRENT: ContextVar[ForwardContext | None] = ContextVar("atom_forward_context", default=None)


@contextmanager
def bind_forward_context(ctx: ForwardContext) -> Iterator[ForwardContext]:
    token = _CURRENT.set(ctx)
    try:
        yield ctx
    finally:
        _CURRENT.reset(token)


def current_forward_context() -> ForwardContext:
    ctx = _CURRENT.get()
    if ctx is None:
        raise RuntimeError("no ForwardContext is bound: call the model inside bind_forward_context(...)")
    return ctx
