"""The runtime bridge: SGLang's ForwardBatch bound as atom-core's ForwardContext for one forward.

The binding is a ContextVar scope (atom-core's bind_forward_context), so a target and a draft wrapper in
one process, or nested forwards, each see only their own batch, and nothing process-global is swapped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from atom_core.integration import ForwardContext, bind_forward_context

FORWARD_BATCH = "sglang_forward_batch"  # the ForwardContext's metadata key: SGLang's ForwardBatch itself


@contextmanager
def sglang_forward(forward_batch) -> Iterator[ForwardContext]:
    """Bind forward_batch for the layers of one model forward (they pass it on to RadixAttention, which
    finds SGLang's pools and backend through it: no caches of ATOM's own)."""
    with bind_forward_context(ForwardContext({FORWARD_BATCH: forward_batch})) as ctx:
        yield ctx
