"""One KV-cache write (T=16k Hkv8 D128, page 16) for profiling with Nsight Compute.

  ncu --clock-control none -k regex:write --launch-skip 3 --launch-count 1 \\
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \\
      python3 packages/atom-kernels/benchmarks/profile_kv_write.py [bf16|fp8-tensor|fp8-token] [flash|shuffle] [pages|random]
"""

import sys

import torch
from bench_paged_attention import DEV, HKV, D

from atom_kernels.cache import KVLayout, kv_cache_shapes, write_kv
from atom_kernels.cache.fp8 import default_fp8_dtype


def main():
    kv = sys.argv[1] if len(sys.argv) > 1 else "bf16"
    layout = KVLayout(sys.argv[2]) if len(sys.argv) > 2 else KVLayout.SHUFFLE
    pattern = sys.argv[3] if len(sys.argv) > 3 else "pages"
    torch.manual_seed(0)
    tokens, block_size = 16384, 16
    num_blocks = tokens // block_size * 2
    if pattern == "pages":
        pages = torch.randperm(num_blocks, device=DEV)[: tokens // block_size]
        slots = (pages[:, None] * block_size + torch.arange(block_size, device=DEV)).flatten()
    else:
        slots = torch.randperm(num_blocks * block_size, device=DEV)[:tokens]
    dtype = default_fp8_dtype(DEV) if kv.startswith("fp8") else torch.bfloat16
    shapes = kv_cache_shapes(layout, num_blocks, block_size, HKV, D, dtype)
    kc = torch.empty(shapes[0], device=DEV, dtype=dtype)
    vc = torch.empty(shapes[1], device=DEV, dtype=dtype)
    k = torch.randn(tokens, HKV, D, device=DEV, dtype=torch.bfloat16)
    v = torch.randn_like(k)
    ks = vs = None
    if kv == "fp8-tensor":
        ks = vs = torch.tensor([0.01], device=DEV)
    elif kv == "fp8-token":
        ks = torch.empty(num_blocks, HKV, block_size, device=DEV)
        vs = torch.empty_like(ks)
    for _ in range(5):
        write_kv(k, v, kc, vc, slots, layout=layout, k_scale=ks, v_scale=vs)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
