"""Flash caches given as strided views: vLLM hands its attention backends one buffer per layer with the K and
V of a token-head side by side ([blocks, heads, tokens, 2*D] logically, token- or head-major in memory).
Writes and every attention entry point must address those views exactly as contiguous caches."""

import pytest
import torch

from atom_kernels.attention import DecodePartition, paged_decode, paged_decode_persistent, paged_prefill
from atom_kernels.cache import write_kv
from atom_kernels.cache.ref import read_kv_ref

GPU = torch.cuda.is_available()
DEVICE = "cuda" if GPU else "cpu"
DTYPE = torch.bfloat16 if GPU else torch.float32
HEAD_DIM = 128 if GPU else 32
TOL = 2e-2 if GPU else 1e-4


def _packed_views(order, num_blocks, block_size, heads, head_dim):
    """NaN-filled K and V [N, B, H, D] views into one packed buffer, token-major or head-major."""
    if order == "token-major":  # vLLM's NHD / LBNHC
        buf = torch.full((num_blocks, block_size, heads, 2 * head_dim), float("nan"), device=DEVICE)
    else:  # vLLM's HND / LBHNC
        buf = torch.full((num_blocks, heads, block_size, 2 * head_dim), float("nan"), device=DEVICE)
        buf = buf.transpose(1, 2)
    buf = buf.to(DTYPE)
    return buf, buf[..., :head_dim], buf[..., head_dim:]


@pytest.mark.parametrize("order", ["token-major", "head-major"])
def test_write_and_attend_through_packed_views(order):
    block_size, heads_q, heads_kv, num_blocks = 16, 8, 2, 12
    seq_lens = [37, 20, 51]
    buf, kc, vc = _packed_views(order, num_blocks, block_size, heads_kv, HEAD_DIM)
    assert not kc.is_contiguous()
    # Block 0 stays NaN: unused table entries point there, so an out-of-range read shows.
    pages = (torch.randperm(num_blocks - 1) + 1).tolist()
    tables = torch.zeros(len(seq_lens), 6, dtype=torch.int32)
    slots = []
    for b, n in enumerate(seq_lens):
        own = [pages.pop() for _ in range(-(-n // block_size))]
        tables[b, : len(own)] = torch.tensor(own)
        slots += [own[i // block_size] * block_size + i % block_size for i in range(n)]
    total = sum(seq_lens)
    k = torch.randn(total + 2, heads_kv, HEAD_DIM, device=DEVICE).to(DTYPE)
    v = torch.randn(total + 2, heads_kv, HEAD_DIM, device=DEVICE).to(DTYPE)
    slot_mapping = torch.tensor([*slots, -1, -1], device=DEVICE)  # two padding tokens
    write_kv(k, v, kc, vc, slot_mapping, backend="triton")
    # Exactly the written token-heads' K and V halves changed, nothing around them.
    assert (~torch.isnan(buf.float())).sum().item() == total * heads_kv * 2 * HEAD_DIM
    tables = tables.to(DEVICE)
    for b, n in enumerate(seq_lens):
        start = sum(seq_lens[:b])
        got_k, got_v = read_kv_ref(kc, vc, tables[b], n)
        torch.testing.assert_close(got_k, k[start : start + n].float(), rtol=0, atol=0)
        torch.testing.assert_close(got_v, v[start : start + n].float(), rtol=0, atol=0)

    # The same cache copied to contiguous tensors is the reference for every entry point.
    kc_dense, vc_dense = kc.contiguous(), vc.contiguous()
    lens = torch.tensor(seq_lens, dtype=torch.int32, device=DEVICE)
    query_lens = [5, 20, 1]  # extend, whole prompt, one token
    cu = torch.tensor([0, 5, 25, 26], dtype=torch.int32, device=DEVICE)
    q = torch.randn(sum(query_lens), heads_q, HEAD_DIM, device=DEVICE).to(DTYPE)
    args = dict(cu_seqlens_q=cu, seq_lens=lens, block_tables=tables, max_query_len=20, backend="triton")
    got = paged_prefill(q, kc, vc, **args)
    want = paged_prefill(q, kc_dense, vc_dense, **args)
    torch.testing.assert_close(got, want, rtol=TOL, atol=TOL)
    assert not torch.isnan(got).any()

    q1 = torch.randn(len(seq_lens), heads_q, HEAD_DIM, device=DEVICE).to(DTYPE)
    decode = dict(seq_lens=lens, block_tables=tables, backend="triton")
    for splits in (1, 3):
        torch.testing.assert_close(
            paged_decode(q1, kc, vc, num_splits=splits, **decode),
            paged_decode(q1, kc_dense, vc_dense, num_splits=splits, **decode),
            rtol=TOL,
            atol=TOL,
        )
    part = DecodePartition.allocate(
        max_batch=4,
        num_q_heads=heads_q,
        num_kv_heads=heads_kv,
        head_dim=HEAD_DIM,
        device=DEVICE,
        num_programs=3,
    )
    torch.testing.assert_close(
        paged_decode_persistent(q1, kc, vc, partition=part, **decode),
        paged_decode(q1, kc_dense, vc_dense, **decode),
        rtol=TOL,
        atol=TOL,
    )


def test_views_with_different_strides_are_refused():
    _, kc, _ = _packed_views("token-major", 4, 16, 2, HEAD_DIM)
    vc = torch.zeros(4, 16, 2, HEAD_DIM, device=DEVICE, dtype=DTYPE)  # contiguous: other strides than kc
    k = torch.zeros(3, 2, HEAD_DIM, device=DEVICE, dtype=DTYPE)
    with pytest.raises(ValueError, match="share strides"):
        write_kv(k, k, kc, vc, torch.arange(3, device=DEVICE))
    with pytest.raises(ValueError, match="unit last stride"):
        every_other = torch.zeros(4, 16, 2, 2 * HEAD_DIM, device=DEVICE, dtype=DTYPE)[..., ::2]
        write_kv(k, k, every_other, every_other, torch.arange(3, device=DEVICE))
