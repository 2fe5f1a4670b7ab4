"""The static buffers a captured decode graph reads, declared by each metadata kind.

A CUDA graph replays on fixed addresses: a step's inputs are copied into static device buffers first.
Each metadata kind (paged attention, per-sequence state) declares the fields it needs and how a step
fills them and how its captured metadata views them; `StaticBuffers` lays every field out in one byte
buffer, which a step fills on the host and copies in one transfer.
"""

from __future__ import annotations

import torch

from atom_core.attention import PagedAttentionMetadata
from atom_core.attention.metadata import cache_slots
from atom_core.cache.metadata import StateMetadata
from atom_core.cache.specs import PAGED, STATE
from atom_core.engine.execution.ahead_rows import commit_states
from atom_core.engine.execution.step_inputs import StepInputs
from atom_kernels.cache import move_rows_back


class StaticBuffers:
    """Named 1-D fields of any dtypes in one device byte buffer with a host twin: a step writes its fields
    on the host and copies the prefix they reached in one transfer (a copy a dtype cost a transfer's
    fixed cost each, several a decode step with drafts). The transfer goes out of a pinned staging copy
    of that prefix (PyTorch's caching host allocator, which reuses it only once the transfer ran), so a
    graph replayed twice in one step (a verify's chain, then the chain of prefills beside it) refills
    its fields without waiting for the device to reach the first replay's transfer."""

    ALIGN = 16  # bytes: every field starts aligned for any element type and vector loads

    def __init__(self, device: torch.device):
        self.device = device
        self._fields: dict[str, tuple[torch.dtype, int, int]] = {}  # name -> (dtype, length, fill)
        self.device_views: dict[str, torch.Tensor] = {}
        self.host_views: dict[str, torch.Tensor] = {}
        self._spans: dict[str, tuple[int, int]] = {}  # name -> (first byte, bytes per element)
        self._device_bytes = self._host_bytes = None
        self._end = 0  # bytes this step's writes reached

    def add(self, name: str, dtype: torch.dtype, length: int, fill: int = 0) -> None:
        self._fields[name] = (dtype, length, fill)

    def allocate(self) -> None:
        offset = 0
        # smallest first: a step's copy ends where its writes do, so the block tables (sized for
        # max_model_len) go last and a short step copies a row of them, not the whole field
        order = sorted(self._fields, key=lambda n: self._fields[n][0].itemsize * self._fields[n][1])
        for name in order:
            dtype, length, _ = self._fields[name]
            size = dtype.itemsize
            self._spans[name] = (offset, size)
            offset += -(-length * size // self.ALIGN) * self.ALIGN
        self._device_bytes = torch.zeros(offset, dtype=torch.uint8, device=self.device)
        self._host_bytes = torch.zeros(offset, dtype=torch.uint8)
        for name, (dtype, length, fill) in self._fields.items():
            first, size = self._spans[name]
            for views, raw in ((self.device_views, self._device_bytes), (self.host_views, self._host_bytes)):
                views[name] = raw[first : first + length * size].view(dtype)
                views[name].fill_(fill)

    def __getitem__(self, name: str) -> torch.Tensor:
        return self.device_views[name]

    def begin(self) -> None:
        """Before writing a step's fields (the host twin is the host's own: nothing to wait for)."""
        self._end = 0

    def _reached(self, name: str, length: int) -> None:
        first, size = self._spans[name]
        self._end = max(self._end, first + length * size)

    def write(self, name: str, values: list[int], length: int) -> None:
        """Field `name`'s first `length` entries: values, padded with the field's fill."""
        dtype, _, fill = self._fields[name]
        self.host_views[name][:length] = torch.tensor(values + [fill] * (length - len(values)), dtype=dtype)
        self._reached(name, length)

    def write_rows(self, name: str, rows: list[list[int]], width: int, used: int) -> None:
        """A field viewed as rows of `width`: the first len(rows) rows' first `used` columns (the columns
        past them keep earlier values, which the reader never reaches)."""
        table = self.host_views[name].view(-1, width)
        table[: len(rows), :used] = torch.tensor(rows, dtype=self._fields[name][0])
        self._reached(name, len(rows) * width)

    def copy(self) -> None:
        """One host-to-device copy, of the prefix this step's writes reached (fields unwritten before it
        are copied unchanged), queued on the current stream."""
        if not self._end:
            return
        prefix = self._host_bytes[: self._end]
        if self.device.type == "cuda":
            prefix = prefix.pin_memory()
        self._device_bytes[: self._end].copy_(prefix, non_blocking=True)


class PagedGraphBuffers:
    """Paged attention: each token's cache slot, each sequence's length and block table."""

    kind = PAGED

    def __init__(self, buffers: StaticBuffers, *, seqs: int, q: int, max_model_len: int, block_size: int):
        self.buffers, self.q, self.block_size = buffers, q, block_size
        self.max_model_len, self.max_pages = max_model_len, -(-max_model_len // block_size)
        buffers.add("slots", torch.int64, seqs * q, fill=-1)  # padded rows write nothing
        buffers.add("seq_lens", torch.int32, seqs, fill=q)  # padded sequences read q rows of block 0
        buffers.add("block_tables", torch.int32, seqs * self.max_pages)
        self.cu = torch.arange(0, (seqs + 1) * q, q, dtype=torch.int32, device=buffers.device)

    def metadata(self, size: int) -> PagedAttentionMetadata:
        q, b = self.q, self.buffers
        # decode splits are sized for max_model_len; the kernels read each sequence's length from seq_lens
        return PagedAttentionMetadata(
            cu_seqlens_q=self.cu[: size + 1],
            seq_lens=b["seq_lens"][:size],
            block_tables=b["block_tables"].view(-1, self.max_pages)[:size],
            slot_mapping=b["slots"][: size * q],
            max_query_len=q,
            max_seq_len=self.max_model_len,
            uniform_query_len=q if q > 1 else None,
        )

    def fill(self, inputs: StepInputs, size: int) -> None:
        tables = inputs.block_tables
        slots = cache_slots(inputs.query_lens, inputs.seq_lens, tables, self.block_size)
        self.buffers.write("slots", slots, size * self.q)
        self.buffers.write("seq_lens", inputs.seq_lens, size)
        # only the columns this batch's tables use are written (max_model_len may be 100x a table's length,
        # and building those rows on the host cost more than the step)
        used = max(map(len, tables))
        rows = [t + [0] * (used - len(t)) for t in tables] + [[0] * used] * (size - len(tables))
        self.buffers.write_rows("block_tables", rows, self.max_pages, used)

    def shift(self, lag: torch.Tensor) -> None:
        """After fill: each sequence's rows, lag [S] positions back (a step launched ahead; the positions
        are the model's input, moved here with the slots they address)."""
        b = self.buffers
        tables = b["block_tables"].view(-1, self.max_pages)
        move_rows_back(b["positions"], b["seq_lens"], b["slots"], tables, lag, self.q, self.block_size)


class StateGraphBuffers:
    """Per-sequence state (GDN): each sequence's state slot and whether it starts fresh; in a verify step,
    the slot that keeps the state after each token."""

    kind = STATE

    def __init__(self, buffers: StaticBuffers, *, seqs: int, q: int, max_model_len: int, block_size: int):
        self.buffers, self.q = buffers, q
        self.cu = torch.arange(0, (seqs + 1) * q, q, dtype=torch.int32, device=buffers.device)
        buffers.add("state_slots", torch.int64, seqs, fill=-1)  # padded rows touch no state
        buffers.add("fresh", torch.int64, seqs)
        if q > 1:
            buffers.add("step_slots", torch.int64, seqs * q, fill=-1)

    def metadata(self, size: int) -> StateMetadata:
        b, q = self.buffers, self.q
        # `fresh` is computed inside the graph, so each replay reads the step's flags
        state = StateMetadata(b["state_slots"][:size], b["fresh"][:size] != 0, self.cu[: size + 1], q)
        if q > 1:  # every sequence verifies drafts: the state after each token is kept
            state.step_slots, state.num_tokens = b["step_slots"][: size * q], size * q
        return state

    def fill(self, inputs: StepInputs, size: int) -> None:
        self.buffers.write("state_slots", inputs.state_slots, size)
        self.buffers.write("fresh", [int(f) for f in inputs.fresh], size)
        if self.q > 1:
            self.buffers.write("step_slots", inputs.step_slots, size * self.q)

    def shift(self, lag: torch.Tensor) -> None:
        """After fill, a verify launched ahead: each sequence starts from the slot of its last accepted
        token of the verify before (ahead_rows.commit_states)."""
        commit_states(self.buffers["step_slots"], self.buffers["state_slots"], lag, self.q)


# every metadata kind a decode graph can carry, and the buffers it declares
GRAPH_BUFFERS = {PAGED: PagedGraphBuffers, STATE: StateGraphBuffers}
