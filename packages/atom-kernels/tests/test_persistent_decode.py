"""Persistent decode: the GPU-computed partition, and decode through it against the reference."""

import pytest
import torch

from atom_kernels.attention import DecodePartition, paged_decode_persistent, plan_decode
from atom_kernels.attention.partition import plan_decode_ref
from atom_kernels.cache import KVLayout
from atom_kernels.cache.fp8 import default_fp8_dtype

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
HEAD_DIM = 128 if GPU else 32
TOL = {torch.float32: 2e-4 if not GPU else 1e-3, torch.float16: 5e-3, torch.bfloat16: 2e-2}


def _partition(batch, programs, block=16, heads=(8, 2)):
    return DecodePartition.allocate(
        max_batch=batch + 3,
        num_q_heads=heads[0],
        num_kv_heads=heads[1],
        head_dim=HEAD_DIM,
        device=DEVICE,
        num_programs=programs,
        block=block,
    )


@pytest.mark.parametrize(
    ("seq_lens", "programs"),
    [([1, 17, 64, 130, 33], 3), ([500, 3, 3, 3, 3, 3, 3], 4), ([16] * 9, 5), ([2000], 7), ([5, 9], 16)],
)
def test_plan_matches_python_and_covers_every_block_once(seq_lens, programs):
    part = _partition(len(seq_lens), programs)
    plan_decode(torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE), part)
    cu, per, base = plan_decode_ref(seq_lens, programs, part.block)
    assert part.cu_blocks[: len(seq_lens) + 1].tolist() == cu
    assert part.per_program.item() == per
    assert part.partial_base[: len(seq_lens)].tolist() == base
    # Independent check: walk each program's range; every block is owned once, every partial slot is used once.
    owner, slots = {}, []
    for p in range(programs):
        for blk in range(p * per, min((p + 1) * per, cu[-1])):
            owner[blk] = owner.get(blk, 0) + 1
        for b in range(len(seq_lens)):
            lo, hi = max(p * per, cu[b]), min((p + 1) * per, cu[b + 1])
            if lo < hi and not (lo == cu[b] and hi == cu[b + 1]):
                slots.append(base[b] + p - cu[b] // per)
    assert sorted(owner) == list(range(cu[-1])) and set(owner.values()) == {1}
    assert sorted(slots) == list(range(len(slots)))  # dense, no slot shared
    assert len(slots) <= len(seq_lens) + programs  # fits the buffers


@pytest.mark.parametrize("layout", list(KVLayout))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16] + ([torch.bfloat16] if GPU else []))
@pytest.mark.parametrize("programs", [1, 3, 8])
def test_persistent_decode_matches_reference(paged_case, layout, dtype, programs):
    seq_lens = [1, 17, 200, 130, 33, 64]  # one long sequence gets split, short ones share programs
    case = paged_case(
        seq_lens=seq_lens,
        query_lens=[1] * 6,
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=16,
        layout=layout,
        dtype=dtype,
        device=DEVICE,
    )
    part = _partition(6, programs)
    out = torch.full_like(case.q, float("nan"))
    paged_decode_persistent(
        case.q,
        case.k_cache,
        case.v_cache,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        partition=part,
        layout=layout,
        out=out,
        backend="triton",
    )
    assert not torch.isnan(out).any()
    expected = case.reference(layout=layout)
    torch.testing.assert_close(out.float(), expected.float(), rtol=TOL[dtype], atol=TOL[dtype])


@pytest.mark.parametrize("programs", [2, 5])
def test_persistent_decode_softcap_sinks_and_a_reused_plan(paged_case, programs):
    case = paged_case(
        seq_lens=[90, 7, 41],
        query_lens=[1, 1, 1],
        num_q_heads=4,
        num_kv_heads=1,
        head_dim=HEAD_DIM,
        block_size=16,
        layout=KVLayout.FLASH,
        dtype=torch.float32,
        device=DEVICE,
    )
    part = _partition(3, programs, heads=(4, 1))
    sinks = torch.randn(4, device=DEVICE)
    kw = dict(
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        partition=part,
        softcap=4.0,
        sinks=sinks,
        backend="triton",
    )
    first = paged_decode_persistent(case.q, case.k_cache, case.v_cache, **kw)
    again = paged_decode_persistent(case.q, case.k_cache, case.v_cache, plan=False, **kw)
    expected = case.reference(softcap=4.0, sinks=sinks)
    torch.testing.assert_close(first, expected, rtol=TOL[torch.float32], atol=TOL[torch.float32])
    torch.testing.assert_close(again, first, rtol=0, atol=0)


@pytest.mark.gpu(reason="fp8 through Triton runs on the GPU (the interpreter's fp8 is wrong)")
@pytest.mark.parametrize("scales", ["tensor", "token"])
def test_persistent_decode_fp8(paged_case, scales):
    case = paged_case(
        seq_lens=[300, 5, 77, 16],
        query_lens=[1] * 4,
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=16,
        layout=KVLayout.FLASH,
        dtype=torch.bfloat16,
        cache_dtype=default_fp8_dtype(torch.device(DEVICE)),
        fp8_scales=scales,
        device=DEVICE,
    )
    out = paged_decode_persistent(
        case.q,
        case.k_cache,
        case.v_cache,
        seq_lens=case.seq_lens,
        block_tables=case.block_tables,
        partition=_partition(4, 6),
        k_scale=case.k_scale,
        v_scale=case.v_scale,
    )
    expected = case.reference()
    torch.testing.assert_close(out.float(), expected.float(), rtol=2e-2, atol=2e-2)


def test_bad_inputs_are_named(paged_case):
    case = paged_case(
        seq_lens=[20, 30],
        query_lens=[1, 1],
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=16,
        layout=KVLayout.FLASH,
        dtype=torch.float32,
        device=DEVICE,
    )
    with pytest.raises(ValueError, match="exceeds the partition's max_batch 1"):
        plan_decode(
            case.seq_lens,
            DecodePartition.allocate(
                max_batch=1, num_q_heads=8, num_kv_heads=2, head_dim=HEAD_DIM, device=DEVICE, num_programs=2
            ),
        )
    with pytest.raises(ValueError, match="partition buffers are for"):
        paged_decode_persistent(
            case.q,
            case.k_cache,
            case.v_cache,
            seq_lens=case.seq_lens,
            block_tables=case.block_tables,
            partition=_partition(2, 2, heads=(4, 2)),
        )
    shuffle = paged_case(
        seq_lens=[20, 30],
        query_lens=[1, 1],
        num_q_heads=8,
        num_kv_heads=2,
        head_dim=HEAD_DIM,
        block_size=16,
        layout=KVLayout.SHUFFLE,
        dtype=torch.float32,
        device=DEVICE,
    )
    with pytest.raises(ValueError, match="multiple of x=4"):
        paged_decode_persistent(
            shuffle.q,
            shuffle.k_cache,
            shuffle.v_cache,
            seq_lens=shuffle.seq_lens,
            block_tables=shuffle.block_tables,
            layout="shuffle",
            partition=DecodePartition.allocate(
                max_batch=2, num_q_heads=8, num_kv_heads=2, head_dim=HEAD_DIM, device=DEVICE, block=2
            ),
        )
