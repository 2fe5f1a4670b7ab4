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

import torch
from torch import nn

from atom_core.engine.execution.graph_buffers import GRAPH_BUFFERS, StaticBuffers
from atom_core.engine.execution.step_inputs import DraftInputs, StepInputs, feed_sampled
from atom_core.forward_context import ForwardContext, bind_forward_context


class DecodeGraphs:
    def __init__(
        self,
        model: nn.Module,
        caches: Sequence,
        metadata_kinds: Collection[str],
        *,
        sizes: Sequence[int],
        max_model_len: int,
        block_size: int,
        device: torch.device,
        query_len: int = 1,
        hidden_input: tuple[int, torch.dtype] | None = None,
    ):
        """sizes: the batch sizes to capture (the plan's graph_sizes). query_len: tokens every sequence adds
        (1: decode; 1 + k: speculative verify of k drafts, whose logits come back for every token).
        hidden_input: (width, dtype) of a third model input, a hidden state per token (a speculative
        draft's), copied into a static buffer each step."""
        unknown = set(metadata_kinds) - set(GRAPH_BUFFERS)
        if unknown:
            raise NotImplementedError(
                f"decode CUDA graphs have no static buffers for {sorted(unknown)} caches"
            )
        self.q = q = query_len
        self.sizes = sorted(sizes)
        n = self.sizes[-1]
        # the model's inputs, then each metadata kind's fields, in one buffer per dtype
        self.buffers = StaticBuffers(device)
        self.buffers.add("ids", torch.int64, n * q)
        self.buffers.add("positions", torch.int64, n * q)
        shape = dict(seqs=n, q=q, max_model_len=max_model_len, block_size=block_size)
        self.kinds = {kind: GRAPH_BUFFERS[kind](self.buffers, **shape) for kind in sorted(metadata_kinds)}
        self.buffers.allocate()
        self.hidden_in = None
        if hidden_input is not None:
            self.hidden_in = torch.zeros(n * q, hidden_input[0], dtype=hidden_input[1], device=device)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.logits: dict[int, torch.Tensor] = {}
        # the model's hidden states per captured size (a speculative draft reads them)
        self.hidden_out: dict[int, torch.Tensor] = {}
        self.hidden: torch.Tensor | None = None  # the last replay's, [batch, H]
        self.replays = 0  # decode steps served by a graph
        ids, positions = self.buffers["ids"], self.buffers["positions"]
        pool = None
        for size in reversed(self.sizes):  # largest first: smaller graphs reuse its memory pool

            def forward(size=size):
                metadata = {kind: buffers.metadata(size) for kind, buffers in self.kinds.items()}
                with bind_forward_context(ForwardContext(metadata, caches)):
                    extra = () if self.hidden_in is None else (self.hidden_in[: size * q],)
                    hidden = model(ids[: size * q], positions[: size * q], *extra)
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

    def serves(self, inputs: StepInputs | DraftInputs) -> bool:
        """Whether inputs is this graph set's case: every sequence adds query_len tokens, all get logits
        (and a target step keeps no state partway through a chunk)."""
        batch = len(inputs.query_lens)
        return (
            not (isinstance(inputs, StepInputs) and inputs.snapshot_slots)
            and len(inputs.ids) == batch * self.q
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
        lag: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One step of len(inputs.query_lens) sequences -> logits [batch * query_len, V] (a view of the
        graph's output). sampled: the last step's tokens on the device, for inputs.fed_rows. lag: [batch]
        int64, how many positions each sequence's rows sit before inputs' (rows launched ahead)."""
        q, batch = self.q, len(inputs.query_lens)
        size = self.size_for(batch)
        assert size is not None, "size_for(batch) must be checked first"
        buffers = self.buffers
        buffers.begin()
        # padded rows: token 0 at position 0; each kind pads its own fields (no writes, no state)
        buffers.write("ids", inputs.ids, size * q)
        buffers.write("positions", inputs.positions, size * q)
        for kind in self.kinds.values():
            kind.fill(inputs, size)
        buffers.copy()
        if sampled is not None and inputs.fed_rows:  # (a draft's inputs feed on nothing)
            feed_sampled(buffers["ids"], inputs.fed_rows, inputs.fed_from, sampled)
        if lag is not None:
            for kind in self.kinds.values():
                kind.shift(lag)
        if hidden_in is not None:
            self.hidden_in[: hidden_in.shape[0]].copy_(hidden_in)
        self.graphs[size].replay()
        self.replays += 1
        self.hidden = self.hidden_out[size][: batch * q]
        return self.logits[size][: batch * q]
