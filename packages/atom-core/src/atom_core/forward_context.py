"""Per-forward state, bound explicitly for the duration of one forward (no process-global mode).

The runner that calls a model binds a ForwardContext with `bind_forward_context`; attention layers read
it with `current_forward_context`. A ContextVar scope means two models in one process (target and draft,
or two engines) each see only the context bound around their own forward.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch


@dataclass(slots=True)
class ForwardContext:
    positions: torch.Tensor  # [T] int64 position of each token in its sequence
    attn_metadata: Any  # the attention backend's own metadata type
    kv_caches: Sequence[Any]  # per attention layer, in the backend's own cache type


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
