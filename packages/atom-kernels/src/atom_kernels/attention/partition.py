"""Persistent-decode work partition: the batch's KV blocks split evenly over a fixed set of programs.

All sequences' KV blocks (BLOCK positions each) are laid end to end; program p of P takes blocks
[p * per, (p + 1) * per), per = ceil(total / P). A program's range may cover several short sequences and
part of a long one; a sequence split over several programs writes partial results that a combine step
merges. The plan is computed on the GPU from seq_lens into buffers allocated once (CUDA-graph safe):
  cu_blocks [B+1]    blocks before each sequence (cumulative)
  per_program [1]    blocks per program
  partial_base [B]   first partial slot of a split sequence, -1 when one program holds all of it
Partials of sequence b live in slots partial_base[b] + (p - cu_blocks[b] // per) for its programs p.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(slots=True)
class DecodePartition:
    num_programs: int  # per KV head
    block: int  # KV positions per unit of work (the decode kernel's BLOCK_N)
    max_batch: int
    cu_blocks: torch.Tensor
    per_program: torch.Tensor
    partial_base: torch.Tensor
    part_o: torch.Tensor  # [max_batch + num_programs, Hq, D] fp32
    part_lse: torch.Tensor  # [max_batch + num_programs, Hq] fp32, log2 units

    @classmethod
    def allocate(
        cls,
        *,
        max_batch: int,
        num_q_heads: int,
        num_kv_heads: int,
        head_dim: int,
        device: torch.device | str,
        num_programs: int | None = None,
        block: int = 64,
    ) -> DecodePartition:
        """Buffers for batches of up to max_batch sequences.

        Default programs: four per SM over the KV heads, the best of 1-16 per SM for skewed, uniform and
        long batches in benchmarks/sweep_persistent.py. On the CPU it counts as one SM.
        """
        device = torch.device(device)
        if num_programs is None:
            sms = (
                torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1
            )
            num_programs = max(1, triton.cdiv(4 * sms, num_kv_heads))
        # Each program boundary splits at most one sequence: at most B + P partial slots.
        slots = max_batch + num_programs
        i32 = dict(dtype=torch.int32, device=device)
        return cls(
            num_programs=num_programs,
            block=block,
            max_batch=max_batch,
            cu_blocks=torch.zeros(max_batch + 1, **i32),
            per_program=torch.zeros(1, **i32),
            partial_base=torch.zeros(max_batch, **i32),
            part_o=torch.empty(slots, num_q_heads, head_dim, dtype=torch.float32, device=device),
            part_lse=torch.empty(slots, num_q_heads, dtype=torch.float32, device=device),
        )


@triton.jit
def _plan_kernel(
    seq_lens_ptr, cu_ptr, per_ptr, base_ptr, batch, P: tl.constexpr, BLOCK: tl.constexpr, CHUNK: tl.constexpr
):
    offs = tl.arange(0, CHUNK)
    tl.store(cu_ptr, 0)
    carry = 0
    for c in range(0, batch, CHUNK):  # pass 1: cumulative blocks
        idx = c + offs
        blocks = tl.cdiv(tl.load(seq_lens_ptr + idx, mask=idx < batch, other=0), BLOCK)
        cu = tl.cumsum(blocks, 0) + carry
        tl.store(cu_ptr + idx + 1, cu, mask=idx < batch)
        carry += tl.sum(blocks, 0)
    per = tl.maximum(tl.cdiv(carry, P), 1)
    tl.store(per_ptr, per)
    carry = 0
    for c in range(0, batch, CHUNK):  # pass 2: partial slots of split sequences
        idx = c + offs
        ok = idx < batch
        first = tl.load(cu_ptr + idx, mask=ok, other=0)
        last = tl.load(cu_ptr + idx + 1, mask=ok, other=0)
        segments = tl.where(last > first, (last - 1) // per - first // per + 1, 0)
        counted = tl.where(segments > 1, segments, 0)
        base = tl.cumsum(counted, 0) - counted + carry
        tl.store(base_ptr + idx, tl.where(segments > 1, base, -1), mask=ok)
        carry += tl.sum(counted, 0)


def plan_decode(seq_lens: torch.Tensor, partition: DecodePartition) -> DecodePartition:
    """Fill `partition` for this batch (seq_lens: [B] int32 on the device, B <= max_batch). No host sync."""
    batch = seq_lens.numel()
    if batch > partition.max_batch:
        raise ValueError(f"batch {batch} exceeds the partition's max_batch {partition.max_batch}")
    _plan_kernel[(1,)](
        seq_lens, partition.cu_blocks, partition.per_program, partition.partial_base, batch,
        P=partition.num_programs, BLOCK=partition.block, CHUNK=1024 if seq_lens.is_cuda else 64,
    )  # fmt: skip
    return partition


def plan_decode_ref(seq_lens: list[int], num_programs: int, block: int) -> tuple[list[int], int, list[int]]:
    """The same plan in plain Python: (cu_blocks, per_program, partial_base)."""
    cu = [0]
    for n in seq_lens:
        cu.append(cu[-1] + -(-n // block))
    per = max(-(-cu[-1] // num_programs), 1)
    base, used = [], 0
    for b in range(len(seq_lens)):
        segments = (cu[b + 1] - 1) // per - cu[b] // per + 1 if cu[b + 1] > cu[b] else 0
        base.append(used if segments > 1 else -1)
        used += segments if segments > 1 else 0
    return cu, per, base
