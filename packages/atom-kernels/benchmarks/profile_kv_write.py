"""One KV-cache write (T=16k Hkv8 D128, page 16) for profiling with Nsight Compute.

  ncu --clock-control none -k regex:write --launch-skip 3 --launch-count 1 \\
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
  python -m benchmarks run profile_kv_write -- [bf16|fp8-tensor|fp8-token] [flash|shuffle] [pages|random]
"""

import sys

import torch

from atom_kernels.cache import KVLayout, write_kv
from benchmarks.harness.paged_cases import write_case, write_slots


def main():
    kv = sys.argv[1] if len(sys.argv) > 1 else "bf16"
    layout = KVLayout(sys.argv[2]) if len(sys.argv) > 2 else KVLayout.SHUFFLE
    pattern = sys.argv[3] if len(sys.argv) > 3 else "pages"
    torch.manual_seed(0)
    tokens, block_size = 16384, 16
    num_blocks = tokens // block_size * 2
    slots = write_slots(pattern, tokens, num_blocks, block_size)
    k, v, kc, vc, ks, vs = write_case(
        layout, kv.removeprefix("fp8-") if kv != "bf16" else None, tokens, num_blocks, block_size
    )
    for _ in range(5):
        write_kv(k, v, kc, vc, slots, layout=layout, k_scale=ks, v_scale=vs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
