"""The static buffers decode graphs replay on (engine/execution/graph_buffers.py), filled on the CPU: each
metadata kind's captured views carry what its eager metadata carries for the real rows, and padding that
writes nothing and touches no state for the rest."""

import pytest
import torch

from atom_core.attention import PagedAttentionMetadata
from atom_core.cache.specs import PAGED, STATE
from atom_core.engine.execution.graph_buffers import GRAPH_BUFFERS, StaticBuffers
from atom_core.engine.execution.step_inputs import StepInputs

BLOCK, MAX_LEN, SEQS = 4, 64, 8


def _step(q: int) -> StepInputs:
    """Three sequences adding q tokens each, at lengths 5, 9 and 2 + q, with scattered block tables."""
    tables = [[7, 3], [1, 12, 5], [9, 13]]
    starts = [5 - q, 9 - q, 2]
    ids, positions, step_slots = [], [], []
    for i, start in enumerate(starts):
        ids += [10 * i + j for j in range(q)]
        positions += range(start, start + q)
        step_slots += [100 + 10 * i + j for j in range(q)] if q > 1 else []
    lens = [s + q for s in starts]
    rows = list(range(3 * q))
    return StepInputs(
        ids, positions, [q] * 3, lens, tables, [0, 1, 2], [4, 0, 6], [False, True, False], rows, step_slots
    )


def _filled(q: int, size: int):
    buffers = StaticBuffers(torch.device("cpu"))
    shape = dict(seqs=SEQS, q=q, max_model_len=MAX_LEN, block_size=BLOCK)
    kinds = {kind: GRAPH_BUFFERS[kind](buffers, **shape) for kind in (PAGED, STATE)}
    buffers.allocate()
    inputs = _step(q)
    buffers.begin()
    for kind in kinds.values():
        kind.fill(inputs, size)
    buffers.copy()
    return inputs, {kind: k.metadata(size) for kind, k in kinds.items()}


@pytest.mark.parametrize("q", [1, 3])
def test_paged_views_equal_the_eager_metadata_and_pad_with_no_writes(q):
    size = 4  # three real sequences padded to a captured size of four
    inputs, meta = _filled(q, size)
    eager = PagedAttentionMetadata.build(
        query_lens=inputs.query_lens,
        seq_lens=inputs.seq_lens,
        block_tables=inputs.block_tables,
        block_size=BLOCK,
        device="cpu",
    )
    paged = meta[PAGED]
    # by hand: position p of a sequence lies at slot table[p // 4] * 4 + p % 4
    by_hand = {1: [12, 20, 38], 3: [30, 31, 12, 50, 51, 20, 38, 39, 52]}[q]
    assert paged.slot_mapping[: 3 * q].tolist() == eager.slot_mapping.tolist() == by_hand
    assert paged.slot_mapping[3 * q :].tolist() == [-1] * q  # the padded sequence writes nothing
    assert paged.seq_lens.tolist() == [*eager.seq_lens.tolist(), q]
    assert paged.cu_seqlens_q.tolist() == list(range(0, (size + 1) * q, q))
    for row, table in enumerate(inputs.block_tables):
        assert paged.block_tables[row, : len(table)].tolist() == table
    assert paged.block_tables.shape == (size, MAX_LEN // BLOCK) and paged.max_seq_len == MAX_LEN


@pytest.mark.parametrize("q", [1, 3])
def test_state_views_carry_slots_fresh_flags_and_step_slots(q):
    inputs, meta = _filled(q, 4)
    state = meta[STATE]
    assert state.slots.tolist() == [4, 0, 6, -1]  # the padded sequence touches no state
    assert state.fresh.tolist() == [False, True, False, False]
    if q > 1:
        assert state.step_slots.tolist() == [*inputs.step_slots, -1, -1, -1]
        assert state.num_tokens == 4 * q


def test_a_later_smaller_step_overwrites_what_it_reads_and_copies_only_its_prefix():
    _, _ = _filled(1, 4)
    buffers = StaticBuffers(torch.device("cpu"))
    paged = GRAPH_BUFFERS[PAGED](buffers, seqs=SEQS, q=1, max_model_len=MAX_LEN, block_size=BLOCK)
    buffers.allocate()
    for inputs, size in (
        (_step(1), 4),
        (StepInputs([3], [8], [1], [9], [[2, 11, 4]], [0], [-1], [False], [0]), 1),
    ):
        buffers.begin()
        paged.fill(inputs, size)
        buffers.copy()
    meta = paged.metadata(1)
    assert meta.slot_mapping.tolist() == [4 * BLOCK + 0]  # position 8: block 4 of its table, offset 0
    assert meta.seq_lens.tolist() == [9] and meta.block_tables[0, :3].tolist() == [2, 11, 4]


def test_a_kind_without_static_buffers_is_refused_by_name():
    from atom_core.engine.execution.cuda_graphs import DecodeGraphs

    with pytest.raises(NotImplementedError, match=r"no static buffers for \['latent'\]"):
        DecodeGraphs(None, [], {PAGED, "latent"}, sizes=[1], max_model_len=8, block_size=4, device="cpu")


def test_every_field_is_one_copy_that_ends_where_the_step_writes():
    buffers = StaticBuffers(torch.device("cpu"))
    buffers.add("ids", torch.int64, SEQS)
    paged = GRAPH_BUFFERS[PAGED](buffers, seqs=SEQS, q=1, max_model_len=MAX_LEN, block_size=BLOCK)
    buffers.allocate()
    raw = buffers["ids"].untyped_storage().data_ptr()
    assert all(buffers[n].untyped_storage().data_ptr() == raw for n in ("ids", "slots", "seq_lens"))
    width = MAX_LEN // BLOCK
    buffers.host_views["block_tables"].view(-1, width)[1:] = 77  # rows a one-sequence step never writes
    buffers.begin()
    buffers.write("ids", [5], 1)
    paged.fill(StepInputs([5], [8], [1], [9], [[2, 11, 4]], [0], [-1], [False], [0]), 1)
    buffers.copy()
    tables = buffers["block_tables"].view(-1, width)
    assert buffers["ids"][0] == 5 and tables[0, :3].tolist() == [2, 11, 4]
    assert not tables[1:].any()  # the block tables go last: the copy stopped after the step's row


@pytest.mark.gpu(reason="a transfer still queued needs a CUDA stream")
def test_refilling_before_the_device_reaches_the_last_transfer_keeps_each_step_s_values():
    """A graph replayed twice in one step: the second fill must neither wait for the device nor change
    what the first transfer carries (it runs from a staging copy, not from the host twin)."""
    buffers = StaticBuffers(torch.device("cuda"))
    buffers.add("ids", torch.int64, SEQS)
    buffers.allocate()
    seen = []
    torch.cuda._sleep(200_000_000)  # the stream stays busy past both fills (~0.1 s)
    for value in (1, 2):
        buffers.begin()
        buffers.write("ids", [value] * SEQS, SEQS)
        buffers.copy()
        seen.append(buffers["ids"].clone())  # queued after this fill's transfer
    assert not torch.cuda.current_stream().query()  # the host did not wait for the device
    torch.cuda.synchronize()
    assert [s.tolist() for s in seen] == [[1] * SEQS, [2] * SEQS]
