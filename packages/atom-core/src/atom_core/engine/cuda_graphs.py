"""CUDA graphs of the decode forward: one graph per captured batch size, replayed on static input buffers.

A decode step (every sequence adds one token) is hundreds of small kernels whose launch cost dominates at
small batches. Each graph is captured once, after a warm-up run (Triton compiles outside the capture),
over slices of shared static buffers; a step copies its inputs into them, pads the batch to the next
captured size and replays. Padded rows attend to one cached token and write nothing (slot -1, state
slot -1).
Attention metadata is fixed at capture except for device tensors: decode splits are sized for
max_model_len, and the kernels read each sequence's true length from seq_lens.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

if TYPE_CHECKING:
    from atom_core.engine.model_runner import StepInputs

from atom_core.attention import PagedAttentionMetadata
from atom_core.cache.metadata import StateMetadata
from atom_core.cache.specs import PAGED, STATE
from atom_core.forward_context import ForwardContext, bind_forward_context

DEFAULT_SIZES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 160, 192, 224, 256)


class DecodeGraphs:
    def __init__(
        self,
        model: nn.Module,
        caches: Sequence,
        metadata_kinds: Collection[str],
        *,
        max_batch: int,
        max_model_len: int,
        block_size: int,
        device: torch.device,
        sizes: Sequence[int] = DEFAULT_SIZES,
    ):
        unknown = set(metadata_kinds) - {PAGED, STATE}
        if unknown:
            raise NotImplementedError(
                f"decode CUDA graphs have no static metadata for {sorted(unknown)} caches"
            )
        self.state = STATE in metadata_kinds
        self.sizes = sorted({s for s in sizes if s < max_batch} | {max_batch})
        self.block_size = block_size
        self.max_pages = -(-max_model_len // block_size)
        n = self.sizes[-1]
        i32 = dict(dtype=torch.int32, device=device)
        # Two device buffers, each filled by one host-to-device copy per step from a pinned twin: the
        # int64 rows ids / positions / slots, and with state layers each sequence's state slot and whether
        # it starts fresh (whole: 24 or 40 bytes a row), and the int32 seq_lens followed by the block
        # tables (a prefix: seq_lens whole, then the batch's table rows).
        rows = 5 if self.state else 3
        self.vectors = torch.zeros(rows, n, dtype=torch.int64, device=device)
        self.ids, self.positions, self.slots = self.vectors[:3]
        self.vectors[2:].fill_(-1)
        self.lens_tables = torch.zeros(n + n * self.max_pages, **i32)
        self.seq_lens = self.lens_tables[:n]
        self.seq_lens.fill_(1)
        self.block_tables = self.lens_tables[n:].view(n, self.max_pages)
        pin = torch.cuda.is_available() and device.type == "cuda"
        self.host_vectors = torch.zeros(rows, n, dtype=torch.int64, pin_memory=pin)
        self.host_lens_tables = torch.zeros(n + n * self.max_pages, dtype=torch.int32, pin_memory=pin)
        self.copied = torch.cuda.Event()
        self.cu = torch.arange(n + 1, **i32)  # one query token per row
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        self.replays = 0  # decode steps served by a graph
        pool = None
        for size in reversed(self.sizes):  # largest first: smaller graphs reuse its memory pool
            meta = PagedAttentionMetadata(
                cu_seqlens_q=self.cu[: size + 1],
                seq_lens=self.seq_lens[:size],
                block_tables=self.block_tables[:size],
                slot_mapping=self.slots[:size],
                max_query_len=1,
                max_seq_len=max_model_len,
            )

            def forward(size=size, meta=meta):
                metadata = {PAGED: meta}
                if self.state:  # `fresh` is computed inside the graph, so each replay reads the step's flags
                    fresh = self.vectors[4, :size] != 0
                    metadata[STATE] = StateMetadata(self.vectors[3, :size], fresh, self.cu[: size + 1], 1)
                with bind_forward_context(ForwardContext(metadata, caches)):
                    hidden = model(self.ids[:size], self.positions[:size])
                return model.compute_logits(hidden)

            forward()  # warm-up: compiles kernels and settles allocations outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.logits[size] = forward()
            pool = graph.pool()
            self.graphs[size] = graph
        torch.cuda.synchronize(device)

    def release(self) -> None:
        """Free every graph and its memory. Needed before NCCL is torn down: destroying a communicator
        whose collectives a live graph captured waits forever (pytorch/pytorch#115388)."""
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.logits.clear()

    def size_for(self, batch: int) -> int | None:
        """The captured size a decode batch of `batch` rows replays at, or None if it is too large."""
        i = bisect.bisect_left(self.sizes, batch)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(self, inputs: StepInputs) -> torch.Tensor:
        """One decode step of len(inputs.ids) sequences -> logits [batch, V] (a view of the graph's output)."""
        ids, positions, seq_lens, block_tables = (
            inputs.ids,
            inputs.positions,
            inputs.seq_lens,
            inputs.block_tables,
        )
        batch = len(ids)
        size = self.size_for(batch)
        assert size is not None, "size_for(batch) must be checked first"
        bs = self.block_size
        slots = [table[p // bs] * bs + p % bs for p, table in zip(positions, block_tables, strict=True)]
        pad = size - batch
        n, width = len(self.seq_lens), self.max_pages
        self.copied.synchronize()  # the last step's copies out of the pinned buffers are done (long since)
        rows = [ids + [0] * pad, positions + [0] * pad, slots + [-1] * pad]
        if self.state:
            rows += [inputs.state_slots + [-1] * pad, [int(f) for f in inputs.fresh] + [0] * pad]
        self.host_vectors[:, :size] = torch.tensor(rows)
        self.host_lens_tables[:size] = torch.tensor(seq_lens + [1] * pad, dtype=torch.int32)
        tables = [t + [0] * (width - len(t)) for t in block_tables] + [[0] * width] * pad
        self.host_lens_tables[n : n + size * width] = torch.tensor(tables, dtype=torch.int32).view(-1)
        self.vectors.copy_(self.host_vectors, non_blocking=True)
        self.lens_tables[: n + size * width].copy_(
            self.host_lens_tables[: n + size * width], non_blocking=True
        )
        self.copied.record()
        self.graphs[size].replay()
        self.replays += 1
        return self.logits[size][:batch]
