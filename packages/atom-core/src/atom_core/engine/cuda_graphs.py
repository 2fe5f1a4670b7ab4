"""CUDA graphs of the decode forward: one graph per captured batch size, replayed on static input buffers.

A decode step (every sequence adds one token) is hundreds of small kernels whose launch cost dominates at
small batches. Each graph is captured once, after a warm-up run (Triton compiles outside the capture),
over slices of shared static buffers; a step copies its inputs into them, pads the batch to the next
captured size and replays. Padded rows attend to one cached token and write nothing (slot -1).
Attention metadata is fixed at capture except for device tensors: decode splits are sized for
max_model_len, and the kernels read each sequence's true length from seq_lens.
"""

from __future__ import annotations

import bisect
from collections.abc import Collection, Sequence

import torch
from torch import nn

from atom_core.attention import PagedAttentionMetadata
from atom_core.cache.specs import PAGED
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
        if set(metadata_kinds) != {PAGED}:  # the static buffers below are the paged metadata's
            raise NotImplementedError(
                f"decode CUDA graphs hold static metadata for paged caches only, the model needs {sorted(metadata_kinds)}"
            )
        self.sizes = sorted({s for s in sizes if s < max_batch} | {max_batch})
        self.block_size = block_size
        self.max_pages = -(-max_model_len // block_size)
        n = self.sizes[-1]
        i32 = dict(dtype=torch.int32, device=device)
        # Two device buffers, each filled by one host-to-device copy per step from a pinned twin: the
        # int64 rows ids / positions / slots (whole: 24 bytes a row), and the int32 seq_lens followed by
        # the block tables (a prefix: seq_lens whole, then the batch's table rows).
        self.vectors = torch.zeros(3, n, dtype=torch.int64, device=device)
        self.ids, self.positions, self.slots = self.vectors
        self.slots.fill_(-1)
        self.lens_tables = torch.zeros(n + n * self.max_pages, **i32)
        self.seq_lens = self.lens_tables[:n]
        self.seq_lens.fill_(1)
        self.block_tables = self.lens_tables[n:].view(n, self.max_pages)
        pin = torch.cuda.is_available() and device.type == "cuda"
        self.host_vectors = torch.zeros(3, n, dtype=torch.int64, pin_memory=pin)
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
            ctx = ForwardContext({PAGED: meta}, caches)

            def forward(size=size, ctx=ctx):
                with bind_forward_context(ctx):
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

    def run(
        self, ids: list[int], positions: list[int], seq_lens: list[int], block_tables: list[list[int]]
    ) -> torch.Tensor:
        """One decode step of len(ids) sequences -> logits [len(ids), V] (a view of the graph's output)."""
        batch = len(ids)
        size = self.size_for(batch)
        assert size is not None, "size_for(batch) must be checked first"
        bs = self.block_size
        slots = [table[p // bs] * bs + p % bs for p, table in zip(positions, block_tables, strict=True)]
        pad = size - batch
        n, width = len(self.seq_lens), self.max_pages
        self.copied.synchronize()  # the last step's copies out of the pinned buffers are done (long since)
        self.host_vectors[:, :size] = torch.tensor(
            [ids + [0] * pad, positions + [0] * pad, slots + [-1] * pad]
        )
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
