"""CUDA graphs of prefill steps: a few sequences of ragged lengths (prefill chunks, decodes beside them),
one graph per captured (token count, sequence count), replayed on static buffers.

A prefill forward of a hybrid MoE model is thousands of small launches (GDN and routing glue, norms,
expert GEMMs) whose host cost, not the GPU's work, sets the time to first token below a few thousand
tokens. A step of n sequences and t tokens replays the smallest captured T >= t, S >= n whose padding
fits: the T - t padded rows belong to S - n padding sequences, one row each but the last, which takes
the rest. A padding sequence writes no cache row (slot -1), reads S rows of block 0 and touches no state
(state slot -1: the GDN kernels skip it and write zeros), like a decode graph's padded rows. MLA layers
attend absorbed, as they do eagerly below the lengths the plan caps these graphs at. Kernel grids
are sized at capture from T and S; the kernels read each sequence's lengths from the buffers. Logits come
back for the step's logits rows only (at most one a sequence: no drafts).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from atom_core.attention import PagedAttentionMetadata
from atom_core.attention.metadata import cache_slots
from atom_core.cache.metadata import StateMetadata
from atom_core.cache.specs import PAGED, STATE
from atom_core.engine.execution.graph_buffers import StaticBuffers
from atom_core.engine.execution.step_inputs import StepInputs, feed_sampled
from atom_core.forward_context import ForwardContext, bind_forward_context
from atom_core.ops import Snapshots


@dataclass(frozen=True, slots=True)
class PrefillLayout:
    """One replay's sequences: the step's n, then the padding ones; every count per sequence padded to S."""

    tokens: int  # T, the captured token count
    seqs: int  # S
    query_lens: list[int]  # [S]: the step's, then the padding sequences' rows
    real: int  # n

    @property
    def cu(self) -> list[int]:
        out = [0]
        for n in self.query_lens:
            out.append(out[-1] + n)
        return out


def pad_layout(query_lens: Sequence[int], tokens: int, seqs: int) -> PrefillLayout | None:
    """The layout of query_lens in T = tokens rows and S = seqs sequences, or None where it does not fit:
    more sequences or tokens than captured, or padded rows without a padding sequence for each."""
    n, t = len(query_lens), sum(query_lens)
    pad, rest = seqs - n, tokens - t
    if pad < 0 or rest < pad or (rest > 0 and pad == 0):
        return None
    padding = [1] * (pad - 1) + [rest - (pad - 1)] if pad else []
    return PrefillLayout(tokens, seqs, [*query_lens, *padding], n)


class PagedPrefillBuffers:
    """Paged attention: each row's cache slot, each sequence's length and block table."""

    kind = PAGED

    def __init__(
        self, buffers: StaticBuffers, *, seqs: int, tokens: int, max_model_len: int, block_size: int
    ):
        self.buffers, self.block_size = buffers, block_size
        self.max_model_len, self.max_pages = max_model_len, -(-max_model_len // block_size)
        buffers.add("slots", torch.int64, tokens, fill=-1)
        buffers.add("seq_lens", torch.int32, seqs)
        buffers.add("block_tables", torch.int32, seqs * self.max_pages)

    def metadata(self, tokens: int, seqs: int) -> PagedAttentionMetadata:
        b = self.buffers
        return PagedAttentionMetadata(
            cu_seqlens_q=b["cu"][: seqs + 1],
            seq_lens=b["seq_lens"][:seqs],
            block_tables=b["block_tables"].view(-1, self.max_pages)[:seqs],
            slot_mapping=b["slots"][:tokens],
            max_query_len=tokens,  # a bound: the grid's rows; each sequence's own from cu
            max_seq_len=self.max_model_len,
        )

    def fill(self, inputs: StepInputs, layout: PrefillLayout) -> None:
        n, tables = layout.real, inputs.block_tables
        slots = cache_slots(inputs.query_lens, inputs.seq_lens, tables, self.block_size)
        self.buffers.write("slots", slots, layout.tokens)
        # a padding sequence of q rows reads q rows of block 0 (its table row is zeros)
        self.buffers.write("seq_lens", [*inputs.seq_lens, *layout.query_lens[n:]], layout.seqs)
        used = max(map(len, tables), default=1)
        rows = [t + [0] * (used - len(t)) for t in tables] + [[0] * used] * (layout.seqs - n)
        self.buffers.write_rows("block_tables", rows, self.max_pages, used)


class StatePrefillBuffers:
    """Per-sequence state (GDN): slot, fresh flag, and the snapshot a chunk keeps partway through."""

    kind = STATE

    def __init__(
        self, buffers: StaticBuffers, *, seqs: int, tokens: int, max_model_len: int, block_size: int
    ):
        self.buffers = buffers
        buffers.add("state_slots", torch.int64, seqs, fill=-1)  # padding sequences touch no state
        buffers.add("fresh", torch.int64, seqs)
        buffers.add("snapshot_slots", torch.int64, seqs, fill=-1)
        buffers.add("snapshot_lens", torch.int64, seqs)

    def metadata(self, tokens: int, seqs: int) -> StateMetadata:
        b = self.buffers
        kept = Snapshots(b["snapshot_slots"][:seqs], b["snapshot_lens"][:seqs])
        # (fresh compared inside the graph, so each replay reads the step's flags; max_query_len a bound)
        return StateMetadata(
            b["state_slots"][:seqs], b["fresh"][:seqs] != 0, b["cu"][: seqs + 1], tokens, snapshots=kept
        )

    def fill(self, inputs: StepInputs, layout: PrefillLayout) -> None:
        self.buffers.write("state_slots", inputs.state_slots, layout.seqs)
        self.buffers.write("fresh", [int(f) for f in inputs.fresh], layout.seqs)
        self.buffers.write("snapshot_slots", inputs.snapshot_slots, layout.seqs)
        self.buffers.write("snapshot_lens", inputs.snapshot_lens, layout.seqs)


PREFILL_BUFFERS = {PAGED: PagedPrefillBuffers, STATE: StatePrefillBuffers}


class PrefillGraphs:
    def __init__(
        self,
        model: nn.Module,
        caches: Sequence,
        metadata_kinds: Collection[str],
        *,
        tokens: Sequence[int],
        seqs: Sequence[int],
        max_model_len: int,
        block_size: int,
        device: torch.device,
        capture: bool = True,
    ):
        """tokens, seqs: the captured counts (the plan's prefill_graph_tokens and _seqs). capture=False
        runs the same static-buffer forward eagerly at each step (what the CPU can test)."""
        unknown = set(metadata_kinds) - set(PREFILL_BUFFERS)
        if unknown:
            raise NotImplementedError(
                f"prefill CUDA graphs have no static buffers for {sorted(unknown)} caches"
            )
        self.tokens, self.seqs = sorted(tokens), sorted(seqs)
        most, widest = self.tokens[-1], self.seqs[-1]
        self.buffers = buffers = StaticBuffers(device)
        buffers.add("ids", torch.int64, most)
        buffers.add("positions", torch.int64, most)
        buffers.add("cu", torch.int32, widest + 1)
        buffers.add("logit_rows", torch.int64, widest)
        shape = dict(seqs=widest, tokens=most, max_model_len=max_model_len, block_size=block_size)
        self.kinds = {kind: PREFILL_BUFFERS[kind](buffers, **shape) for kind in sorted(metadata_kinds)}
        buffers.allocate()
        self.model, self.caches, self.capture = model, caches, capture
        self.graphs: dict[tuple[int, int], torch.cuda.CUDAGraph] = {}
        self.outputs: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}  # (hidden, logits)
        self.hidden: torch.Tensor | None = None  # the last replay's hidden states, [t, H]
        self.replays = 0
        if not capture:
            return
        pool = None
        for key in sorted(((t, s) for t in self.tokens for s in self.seqs), reverse=True):
            self._fill(StepInputs([], [], [], [], [], [], [], [], [], []), pad_layout([], *key))
            self._forward(*key)  # warm-up: compiles kernels and settles allocations outside the capture
            torch.cuda.synchronize(device)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self.outputs[key] = self._forward(*key)
            pool = graph.pool()
            self.graphs[key] = graph
        torch.cuda.synchronize(device)

    def _forward(self, tokens: int, seqs: int) -> tuple[torch.Tensor, torch.Tensor]:
        b = self.buffers
        metadata = {kind: k.metadata(tokens, seqs) for kind, k in self.kinds.items()}
        with bind_forward_context(ForwardContext(metadata, self.caches)):
            hidden = self.model(b["ids"][:tokens], b["positions"][:tokens])
        return hidden, self.model.compute_logits(hidden[b["logit_rows"][:seqs]])

    def layout_for(self, inputs: StepInputs) -> PrefillLayout | None:
        """The smallest captured shape this step's rows fit, if any."""
        for tokens in self.tokens:
            for seqs in self.seqs:
                layout = pad_layout(inputs.query_lens, tokens, seqs)
                if layout is not None:
                    return layout
        return None

    def serves(self, inputs: StepInputs) -> bool:
        """Whether a captured shape replays this step: no drafts or per-token states (a verify), no prompt
        scores, no rows launched ahead of a verify, at most one logits row a sequence, and a shape it fits."""
        return (
            not inputs.step_slots
            and not inputs.prompt_rows
            and not inputs.shift_from
            and not inputs.verify_ahead
            and len(inputs.logit_rows) <= len(inputs.query_lens)
            and self.layout_for(inputs) is not None
        )

    def _fill(self, inputs: StepInputs, layout: PrefillLayout) -> None:
        b = self.buffers
        b.begin()
        b.write("ids", inputs.ids, layout.tokens)  # padded rows: token 0 at position 0
        b.write("positions", list(inputs.positions), layout.tokens)
        b.write("cu", layout.cu, layout.seqs + 1)
        b.write("logit_rows", inputs.logit_rows, layout.seqs)
        for kind in self.kinds.values():
            kind.fill(inputs, layout)
        b.copy()

    def run(
        self, inputs: StepInputs, sampled: torch.Tensor | None = None, lag: torch.Tensor | None = None
    ) -> torch.Tensor:
        """One step -> logits [len(inputs.logit_rows), V] (a view of the graph's output); self.hidden its
        rows' hidden states. sampled: the last step's tokens on the device, for inputs.fed_rows. lag: as
        DecodeGraphs.run's, always None here (serves() takes no rows launched ahead of a verify)."""
        layout = self.layout_for(inputs)
        assert layout is not None and lag is None, "serves(inputs) must be checked first"
        self._fill(inputs, layout)
        if sampled is not None and inputs.fed_rows:
            feed_sampled(self.buffers["ids"], inputs.fed_rows, inputs.fed_from, sampled)
        key = (layout.tokens, layout.seqs)
        if self.capture:
            self.graphs[key].replay()
            hidden, logits = self.outputs[key]
        else:
            hidden, logits = self._forward(*key)
        self.replays += 1
        self.hidden = hidden[: len(inputs.ids)]
        return logits[: len(inputs.logit_rows)]

    def release(self) -> None:
        """Free every graph and its memory (before NCCL is torn down, as DecodeGraphs.release)."""
        for graph in self.graphs.values():
            graph.reset()
        self.graphs.clear()
        self.outputs.clear()
        self.hidden = None
