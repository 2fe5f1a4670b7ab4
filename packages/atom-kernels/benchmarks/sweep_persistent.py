"""Programs-per-SM sweep for the persistent decode partition (picks DecodePartition's default).

PYTHONPATH=packages/atom-kernels/src:packages/atom-kernels/benchmarks python3 .../sweep_persistent.py
"""

from functools import partial

import torch
import triton

from atom_kernels.attention import DecodePartition, paged_decode_persistent
from benchmarks.harness.paged_cases import DEV, HKV, HQ, D, bench, ragged_cache


def main():
    torch.manual_seed(0)
    sms = torch.cuda.get_device_properties(DEV).multi_processor_count
    for name, seq_lens in [
        ("1x32k + 63x1k", [32768] + [1024] * 63),
        ("64x8k", [8192] * 64),
        ("8x32k", [32768] * 8),
    ]:
        kc, vc, tables = ragged_cache(seq_lens, 16)
        q = torch.randn(len(seq_lens), HQ, D, device=DEV, dtype=torch.bfloat16)
        lens = torch.tensor(seq_lens, device=DEV, dtype=torch.int32)
        for per_sm in (1, 2, 4, 8, 16):
            programs = triton.cdiv(per_sm * sms, HKV)
            part = DecodePartition.allocate(
                max_batch=len(seq_lens),
                num_q_heads=HQ,
                num_kv_heads=HKV,
                head_dim=D,
                device=DEV,
                num_programs=programs,
            )
            ms = bench(
                partial(
                    paged_decode_persistent, q, kc, vc, seq_lens=lens, block_tables=tables, partition=part
                )
            )
            tb_s = sum(seq_lens) * HKV * D * 4 / (ms * 1e-3) / 1e12
            print(f"{name:<16} {per_sm:>2}/SM ({programs:>4} programs/head) {ms:7.3f} ms {tb_s:5.2f} TB/s")


if __name__ == "__main__":
    main()
