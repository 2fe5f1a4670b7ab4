"""fp8 experts: e4m3 stacked weights with block scales, mapped from each expert's checkpoint grid.

A checkpoint stores every expert's gate, up and down projections as e4m3 with `weight_scale_inv` grids
in [bm, bn] blocks. Tensor parallel splits the intermediate dimension, which may start a rank inside a
block; the stacked scales then use the coarsest grid that never straddles a checkpoint block or the
gate/up boundary (one grid for w13 and w2, as the fused kernels take one block).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from atom_core.config import ParallelConfig
from atom_core.ops import ExpertScales
from atom_core.quantization import QuantConfig
from atom_core.quantization.fp8 import check_grid, is_kernel_group, regrid

E4M3 = torch.float8_e4m3fn


@dataclass(frozen=True, slots=True)
class ExpertsFp8:
    block: tuple[int, int]  # the checkpoint's
    local: tuple[int, int]  # the stacked scales' (rows, cols) per scale element
    hidden: int
    inter: int  # this rank's intermediate size
    rank: int
    tp_size: int

    @classmethod
    def for_layer(
        cls, quant_config: QuantConfig | None, prefix: str, hidden: int, inter: int, parallel: ParallelConfig
    ) -> ExpertsFp8 | None:
        """None for unquantized experts; inter is this rank's intermediate size."""
        block = quant_config.experts_block(prefix) if quant_config is not None else None
        if block is None:
            return None
        start = parallel.tp_rank * inter
        local = (math.gcd(block[0], inter, start), math.gcd(block[1], start))
        if not is_kernel_group(local[1]):
            raise ValueError(
                f"{prefix}: tensor-parallel rank {parallel.tp_rank} starts its experts' intermediate columns "
                f"at {start}, inside a {block[1]}-wide scale block, which leaves {local[1]}-wide groups; the "
                "fp8 expert kernels need groups of a power of two >= 16 (choose another tensor-parallel size)"
            )
        return cls(block, local, hidden, inter, parallel.tp_rank, parallel.tp_size)

    def create_scales(self, experts: int) -> tuple[nn.Parameter, nn.Parameter]:
        """(w13 scales [E, 2I/rows, ceil(H/cols)], w2 scales [E, ceil(H/rows), ceil(I/cols)]) fp32."""
        (rows, cols), hidden, inter = self.local, self.hidden, self.inter
        shapes = (
            (experts, 2 * inter // rows, math.ceil(hidden / cols)),
            (experts, math.ceil(hidden / rows), math.ceil(inter / cols)),
        )
        params = tuple(
            nn.Parameter(torch.empty(shape, dtype=torch.float32), requires_grad=False) for shape in shapes
        )
        for param in params:
            param.block_scale = True
        return params

    def load_scale(self, param: nn.Parameter, loaded: torch.Tensor, expert, which: str) -> None:
        """One expert's checkpoint grid: gate/up [ceil(I/bm), ceil(H/bn)], down [ceil(H/bm), ceil(I/bn)]."""
        if expert == "all":
            raise ValueError("fp8 experts load per expert (experts.E.{gate,up,down}_proj.weight_scale_inv)")
        full, hidden, start = self.inter * self.tp_size, self.hidden, self.rank * self.inter
        if which == "w2":
            check_grid(loaded, hidden, full, self.block)
            param.data[expert].copy_(regrid(loaded, self.block, self.local, (0, hidden), (start, self.inter)))
            return
        check_grid(loaded, full, hidden, self.block)
        local = regrid(loaded, self.block, self.local, (start, self.inter), (0, hidden))
        dst = 0 if which == "w1" else self.inter // self.local[0]
        param.data[expert].narrow(0, dst, local.shape[0]).copy_(local)

    def scales(self, w13_scale: torch.Tensor, w2_scale: torch.Tensor) -> ExpertScales:
        return ExpertScales(w13_scale, w2_scale, self.local)
