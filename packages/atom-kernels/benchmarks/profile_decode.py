"""One paged decode launch (B=64 L=8k Hq32/Hkv8/D128, page 16) for profiling with Nsight Compute.

  ncu --clock-control none -k regex:paged_attention_kernel --launch-skip 3 --launch-count 1 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
  python -m benchmarks run profile_decode -- [bf16|fp8] [flash|shuffle]
"""

import sys

import torch

from atom_kernels.attention import paged_decode
from atom_kernels.cache import KVLayout
from benchmarks.harness.paged_cases import DEV, HQ, D, paged_cache


def main():
    fp8 = sys.argv[1] == "fp8" if len(sys.argv) > 1 else False
    layout = KVLayout(sys.argv[2]) if len(sys.argv) > 2 else KVLayout.FLASH
    torch.manual_seed(0)
    kc, vc, tables, ks, vs, _, _ = paged_cache(
        64, 8192, 16, layout, torch.bfloat16, "tensor" if fp8 else None
    )
    q = torch.randn(64, HQ, D, device=DEV, dtype=torch.bfloat16)
    seq_lens = torch.full((64,), 8192, device=DEV, dtype=torch.int32)
    for _ in range(5):
        paged_decode(
            q,
            kc,
            vc,
            seq_lens=seq_lens,
            block_tables=tables,
            layout=layout,
            k_scale=ks,
            v_scale=vs,
            max_seq_len=8192,
        )
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
