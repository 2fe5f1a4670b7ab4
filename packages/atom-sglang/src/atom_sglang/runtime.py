"""The runtime bridge: SGLang's ForwardBatch bound as atom-core's ForwardContext for one forward.

The binding is a ContextVar scope (atom-core's bind_forward_context), so a target and a draft wrapper in
one process, or nested forwards, each see only their own batch, and nothing process-global is swapped.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch

from atom_core.integration import ForwardContext, bind_forward_context


@contextmanager
def sglang_forward(forward_batch, positions: torch.Tensor) -> Iterator[ForwardContext]:
    """Bind forward_batch for the layers of one model forward (they pass it on to RadixAttention)."""
    with bind_forward_context(
        ForwardContext(positions=positions, attn_metadata=forward_batch, kv_caches=())
    ) as ctx:
        yield ctx
