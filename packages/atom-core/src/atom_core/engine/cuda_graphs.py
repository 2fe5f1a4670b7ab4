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
from atom_core.engine.async_scheduling import feed_sampled
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
        query_len: int = 1,
        hidden_input: tuple[int, torch.dtype] | None = None,
    ):
        """query_len: tokens every sequence adds (1: decode; 1 + k: speculative verify of k drafts, whose
        logits come back for every token). hidden_input: (width, dtype) of a third model input, a hidden
        state per token (a speculative draft's), copied into a static buffer each step."""
        unknown = set(metadata_kinds) - {PAGED, STATE}
        if unknown:
            raise NotImplementedError(
                f"decode CUDA graphs have no static metadata for {sorted(unknown)} caches"
            )
        self.state = STATE in metadata_kinds
        self.q = q = query_len
        self.sizes = sorted({s for s in sizes if s < max_batch} | {max_batch})
        self.block_size = block_size
        self.max_pages = -(-max_model_len // block_size)
        n = self.sizes[-1]
        i32 = dict(dtype=torch.int32, device=device)
        # Two device buffers, each filled by one host-to-device copy per step from a pinned twin: the
        # int64 rows ids / positions / slots, and with state layers each sequence's state slot and whether
        # it starts fresh (and in a verify, each token's step slot), and the int32 seq_lens followed by
        # the block tables (a prefix: seq_lens whole, then the batch's table rows).
        rows = (6 if q > 1 else 5) if self.state else 3
        self.vectors = torch.zeros(rows, n * q, dtype=torch.int64, device=device)
        self.ids, self.positions, self.slots = self.vectors[:3]
        self.vectors[2:].fill_(-1)
        self.lens_tables = torch.zeros(n + n * self.max_pages, **i32)
        self.seq_lens = self.lens_tables[:n]
        self.seq_lens.fill_(q)
        self.block_tables = self.lens_tables[n:].view(n, self.max_pages)
        pin = torch.cuda.is_available() and device.type == "cuda"
        self.host_vectors = torch.zeros(rows, n * q, dtype=torch.int64, pin_memory=pin)
        self.host_lens_tables = torch.zeros(n + n * self.max_pages, dtype=torch.int32, pin_memory=pin)
        self.copied = torch.cuda.Event()
        self.cu = torch.arange(0, (n + 1) * q, q, **i32)  # query_len tokens per sequence
        self.hidden_in = None
        if hidden_input is not None:
            self.hidden_in = torch.zeros(n * q, hidden_input[0], dtype=hidden_input[1], device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        # the model's hidden states per captured size (a speculative draft reads them)
        self.hidden_out: dict[int, torch.Tensor] = {}
        self.hidden: torch.Tensor | None = None  # the last replay's, [batch, H]
        self.replays = 0  # decode steps served by a graph
        pool = None
        for size in reversed(self.sizes):  # largest first: smaller graphs reuse its memory pool
            meta = PagedAttentionMetadata(
                cu_seqlens_q=self.cu[: size + 1],
                seq_lens=self.seq_lens[:size],
                block_tables=self.block_tables[:size],
                slot_mapping=self.slots[: size * q],
                max_query_len=q,
                max_seq_len=max_model_len,
                uniform_query_len=q if q > 1 else None,
            )

            def forward(size=size, meta=meta):
                metadata = {PAGED: meta}
                if self.state:  # `fresh` is computed inside the graph, so each replay reads the step's flags
                    fresh = self.vectors[4, :size] != 0
                    state = StateMetadata(self.vectors[3, :size], fresh, self.cu[: size + 1], q)
                    if q > 1:  # every sequence verifies drafts: the state after each token is kept
                        state.step_slots, state.num_tokens = self.vectors[5, : size * q], size * q
                    metadata[STATE] = state
                with bind_forward_context(ForwardContext(metadata, caches)):
                    extra = () if self.hidden_in is None else (self.hidden_in[: size * q],)
                    hidden = model(self.ids[: size * q], self.positions[: size * q], *extra)
                return hidden, model.compute_logits(hidden)

            forward()  # warm-up: compiles kernels and settles allocations outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.hidden_out[size], self.logits[size] = forward()
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
        self.hidden_out.clear()
        self.hidden = None

    def serves(self, inputs: StepInputs) -> bool:
        """Whether inputs is this graph set's case: every sequence adds query_len tokens, all get logits."""
        batch = len(inputs.query_lens)
        return (
            len(inputs.ids) == batch * self.q
            and len(inputs.logit_rows) == len(inputs.ids)
            and all(n == self.q for n in inputs.query_lens)
            and self.size_for(batch) is not None
        )

    def size_for(self, batch: int) -> int | None:
        """The captured size a decode batch of `batch` rows replays at, or None if it is too large."""
        i = bisect.bisect_left(self.sizes, batch)
        return self.sizes[i] if i < len(self.sizes) else None

    def run(
        self,
        inputs: StepInputs,
        hidden_in: torch.Tensor | None = None,
        sampled: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step of len(inputs.query_lens) sequences -> logits [batch * query_len, V] (a view of the
        graph's output). sampled: the last step's tokens on the device, for inputs.fed_rows."""
        ids, positions, seq_lens, block_tables = (
            inputs.ids,
            inputs.positions,
            inputs.seq_lens,
            inputs.block_tables,
        )
        q, batch = self.q, len(seq_lens)
        size = self.size_for(batch)
        assert size is not None, "size_for(batch) must be checked first"
        bs = self.block_size
        slots = [block_tables[i // q][p // bs] * bs + p % bs for i, p in enumerate(positions)]
        pad, tokens_pad = size - batch, (size - batch) * q
        n, width = len(self.seq_lens), self.max_pages
        self.copied.synchronize()  # the last step's copies out of the pinned buffers are done (long since)
        rows = [ids + [0] * tokens_pad, positions + [0] * tokens_pad, slots + [-1] * tokens_pad]
        if self.state:
            # per-sequence rows, padded to the token width of the buffer
            width_pad = size * q - batch
            rows += [inputs.state_slots + [-1] * width_pad, [int(f) for f in inputs.fresh] + [0] * width_pad]
            if q > 1:
                rows.append(inputs.step_slots + [-1] * tokens_pad)
        self.host_vectors[:, : size * q] = torch.tensor(rows)
        # padding sequences read q rows of block 0 (garbage, finite; their outputs are dropped)
        self.host_lens_tables[:size] = torch.tensor(seq_lens + [q] * pad, dtype=torch.int32)
        # Only the columns this batch's tables use are written (max_model_len may be 100x a table's
        # length, and building those rows on the host cost more than the step); the columns past them
        # keep earlier block ids, valid and never read below a sequence's length.
        used = max(map(len, block_tables))
        tables = [t + [0] * (used - len(t)) for t in block_tables] + [[0] * used] * pad
        host_tables = self.host_lens_tables[n:].view(n, width)
        host_tables[:size, :used] = torch.tensor(tables, dtype=torch.int32)
        self.vectors.copy_(self.host_vectors, non_blocking=True)
        self.lens_tables[: n + size * width].copy_(
            self.host_lens_tables[: n + size * width], non_blocking=True
        )
        self.copied.record()
        if sampled is not None and inputs.fed_rows:  # (a draft's inputs feed on nothing)
            feed_sampled(self.ids, inputs.fed_rows, inputs.fed_from, sampled)
        if hidden_in is not None:
            self.hidden_in[: hidden_in.shape[0]].copy_(hidden_in)
        self.graphs[size].replay()
        self.replays += 1
        self.hidden = self.hidden_out[size][: batch * q]
        return self.logits[size][: batch * q]
