"""Token-tile sweep for the rotary kernels (how rotary_tiles was chosen), at T=16k, bf16.

  python -m benchmarks run sweep_rotary

Per shape and (BLOCK_T, num_warps): median time and TB/s of the rotated bytes (read + written in place);
the default from rotary_tiles is marked.
"""

from __future__ import annotations

from functools import partial

import torch
import triton

from atom_kernels.rotary.packs import head_rows
from atom_kernels.rotary.rope import _rotary_kernel, rotary_tiles

DEV, T = torch.device("cuda"), 16384
SHAPES = [  # name, q heads, kv heads, head dim, rotary dim, mrope section (None: plain RoPE), interleaved
    ("rope Llama-3 8B", 32, 8, 128, 128, None, False),
    ("rope partial head 256 rot 64", 16, 2, 256, 64, None, False),
    ("mrope interleaved Qwen3.5", 16, 2, 256, 64, (11, 11, 10), True),
    ("mrope chunked Qwen2.5-VL", 28, 4, 128, 128, (16, 24, 24), False),
]


def _launch(grid, pos, q, k, inv_freq, section, interleaved, common):
    rows = (head_rows(q), head_rows(k), inv_freq, q.shape[0])
    stride_pos = pos.stride(0) if section else 0
    _rotary_kernel[grid](
        pos, *rows, stride_pos, 1.0, SECTION=tuple(section or (0, 0, 0)), INTERLEAVED=interleaved,
        MROPE=bool(section), **common,
    )  # fmt: skip


def main():
    for name, hq, hkv, d, rot, section, interleaved in SHAPES:
        qkv = torch.randn(T, (hq + 2 * hkv) * d, device=DEV, dtype=torch.bfloat16)
        q, k = qkv[:, : hq * d].view(T, hq, d), qkv[:, hq * d : (hq + hkv) * d].view(T, hkv, d)
        half = rot // 2
        inv_freq = 1.0 / (1e6 ** (torch.arange(0, rot, 2, device=DEV).float() / rot))
        pos = torch.randint(0, 32768, (3, T) if section else (T,), device=DEV)
        bqh, bkh, bhalf, default_t, default_w = rotary_tiles(hq, hkv, half)
        moved = 2 * T * (hq + hkv) * rot * 2
        for block_t in (1, 2, 4, 8, 16):
            for warps in (1, 2, 4, 8):
                grid = (triton.cdiv(T, block_t),)
                common = dict(
                    NEOX=True,
                    HALF=half,
                    BLOCK_QH=bqh,
                    BLOCK_KH=bkh,
                    BLOCK_HALF=bhalf,
                    BLOCK_T=block_t,
                    num_warps=warps,
                )
                run = partial(_launch, grid, pos, q, k, inv_freq, section, interleaved, common)
                ms = triton.testing.do_bench(run, warmup=25, rep=100, return_mode="median")
                mark = "  <- default" if (block_t, warps) == (default_t, default_w) else ""
                print(
                    f"{name:30} BLOCK_T={block_t:2d} warps={warps}  {ms * 1e3:7.1f} us  {moved / ms / 1e9:5.2f} TB/s{mark}"
                )


if __name__ == "__main__":
    main()
