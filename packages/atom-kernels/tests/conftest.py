"""Shared fixtures, and the Triton interpreter on machines without a GPU."""

import json
import os
import subprocess
import sys
from dataclasses import dataclass

import pytest
import torch

# Triton kernels run on the CPU only through the interpreter, which must be chosen before the
# first @triton.jit runs (that is, before atom_kernels is imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# Imported after TRITON_INTERPRET is set: the first @triton.jit decides interpreter or not.
from atom_kernels.attention import PagedCall, paged_attention_ref
from atom_kernels.cache import kv_cache_shapes
from atom_kernels.cache.fp8 import fp8_max, is_fp8
from atom_kernels.cache.ref import write_kv_ref

POISON_PAGE = 0  # a NaN page: unused block-table entries point here, so reading one shows as NaN


@dataclass
class PagedCase:
    q: torch.Tensor
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    k_scale: torch.Tensor | None
    v_scale: torch.Tensor | None
    max_query_len: int

    def args(self):
        return dict(
            cu_seqlens_q=self.cu_seqlens_q,
            seq_lens=self.seq_lens,
            block_tables=self.block_tables,
            k_scale=self.k_scale,
            v_scale=self.v_scale,
        )

    def reference(self, **options) -> torch.Tensor:
        """paged_attention_ref of this case with the scales it was built with and `options` (layout,
        softmax_scale, sliding_window, softcap, sinks)."""
        call = PagedCall(
            self.q, self.k_cache, self.v_cache, self.cu_seqlens_q, self.seq_lens, self.block_tables,
            k_scale=self.k_scale, v_scale=self.v_scale, **options,
        )  # fmt: skip
        return paged_attention_ref(call)


def make_case(
    *,
    seq_lens,
    query_lens,
    num_q_heads,
    num_kv_heads,
    head_dim,
    block_size,
    layout,
    dtype,
    cache_dtype=None,
    fp8_scales=None,
    device="cpu",
    spare_pages=3,
) -> PagedCase:
    cache_dtype = cache_dtype or dtype
    pages = [-(-n // block_size) for n in seq_lens]
    num_blocks = 1 + sum(pages) + spare_pages
    order = (torch.randperm(num_blocks - 1) + 1).tolist()  # physical pages in random order, 0 is poison
    max_pages = max(pages) + 2
    block_tables = torch.full((len(seq_lens), max_pages), POISON_PAGE, dtype=torch.int32)
    slots = []
    for b, n in enumerate(seq_lens):
        table = [order.pop() for _ in range(pages[b])]
        block_tables[b, : pages[b]] = torch.tensor(table, dtype=torch.int32)
        slots += [table[i // block_size] * block_size + i % block_size for i in range(n)]
    k_shape, v_shape = kv_cache_shapes(layout, num_blocks, block_size, num_kv_heads, head_dim, cache_dtype)
    k_cache = torch.full(k_shape, float("nan"), device=device).to(cache_dtype)  # e4m3 has a NaN too
    v_cache = torch.full(v_shape, float("nan"), device=device).to(cache_dtype)
    total = sum(seq_lens)
    k = torch.randn(total, num_kv_heads, head_dim, device=device)
    v = torch.randn(total, num_kv_heads, head_dim, device=device)
    k_scale = v_scale = None
    if is_fp8(cache_dtype):
        if fp8_scales == "tensor":
            k_scale = (k.abs().amax() / fp8_max(cache_dtype)).reshape(1)
            v_scale = (v.abs().amax() / fp8_max(cache_dtype)).reshape(1)
        else:
            k_scale = torch.full((num_blocks, num_kv_heads, block_size), float("nan"), device=device)
            v_scale = k_scale.clone()
    else:
        k, v = k.to(dtype), v.to(dtype)
    write_kv_ref(k, v, k_cache, v_cache, torch.tensor(slots, device=device), layout, k_scale, v_scale)
    if is_fp8(cache_dtype) and fp8_scales != "tensor":
        k_scale[POISON_PAGE] = v_scale[POISON_PAGE] = float("nan")
    cu = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    cu[1:] = torch.tensor(query_lens).cumsum(0)
    q = torch.randn(int(cu[-1]), num_q_heads, head_dim, device=device).to(dtype)
    return PagedCase(
        q=q,
        k_cache=k_cache,
        v_cache=v_cache,
        cu_seqlens_q=cu.to(device),
        seq_lens=torch.tensor(seq_lens, dtype=torch.int32, device=device),
        block_tables=block_tables.to(device),
        k_scale=k_scale,
        v_scale=v_scale,
        max_query_len=max(query_lens),
    )


@pytest.fixture
def paged_case():
    """make_case(...): a random paged-attention scenario (see make_case)."""
    return make_case


@pytest.fixture(scope="session")
def forked_ranks():
    """forked_ranks(world, rank_main): run rank_main(rank) in `world` forked processes at once (the
    collectives' CPU harness: their barriers really wait for each other) and check that each exited 0
    within 300 s."""

    def run(world: int, rank_main) -> None:
        import multiprocessing as mp

        procs = [mp.get_context("fork").Process(target=rank_main, args=(r,)) for r in range(world)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(timeout=300)
        hung = [p.pid for p in procs if p.is_alive()]
        for p in procs:
            p.kill()
        assert not hung, "a rank never got the other ranks' data"
        assert [p.exitcode for p in procs] == [0] * world

    return run


@pytest.fixture(scope="session")
def offline_builds(tmp_path_factory):
    """offline_builds(test_file) -> the JSON that test_file, run as a script with an output path, writes: its
    offline sm90 builds, compiled in a fresh interpreter without TRITON_INTERPRET. In the CPU test session the
    interpreter has patched triton.language's tensor operators for good (its device-function calls do not
    undo their patches), which breaks any later compile in the same process."""

    def build(test_file: str) -> dict:
        path = tmp_path_factory.mktemp("sm90") / "builds.json"
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        subprocess.run([sys.executable, test_file, str(path)], env=env, check=True)
        return json.loads(path.read_text())

    return build
