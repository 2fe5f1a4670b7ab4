"""MXFP4 experts: e2m1 bytes and e8m0 scales per 32 values, loaded from the checkpoint's `*_blocks`
[E, N, K / 32, 16] and `*_scales` [E, N, K / 32] (GPT-OSS's gate/up rows alternate gate and up).

Tensor parallel splits the intermediate dimension: w13's rows (any split) and w2's columns, which must
fall on whole 32-value groups, so each rank's intermediate size is a multiple of 32.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from atom_core.config import ConfigError, ParallelConfig
from atom_core.ops import MXFP4_GROUP, MXFP4_MAX_SCALE_BYTE, ExpertMxfp4
from atom_core.quantization import QuantConfig

# shard ids of the checkpoint's tensors: gate/up with alternating rows, down as stored
GATE_UP, DOWN = "mxfp4_interleaved", "mxfp4"


@dataclass(frozen=True, slots=True)
class ExpertsMxfp4:
    hidden: int
    inter: int  # this rank's intermediate size
    rank: int
    tp_size: int

    @classmethod
    def for_layer(
        cls, quant_config: QuantConfig | None, prefix: str, hidden: int, inter: int, parallel: ParallelConfig
    ) -> ExpertsMxfp4 | None:
        """None unless the config makes the experts at `prefix` MXFP4; inter is this rank's share."""
        if quant_config is None or not quant_config.experts_mxfp4(prefix):
            return None
        for name, size in (
            ("hidden_size", hidden),
            (f"intermediate size on each of {parallel.tp_size} ranks", inter),
        ):
            if size % MXFP4_GROUP:
                raise ConfigError(
                    f"{prefix}: MXFP4 experts need whole {MXFP4_GROUP}-value scale groups, but the {name} "
                    f"is {size}"
                )
        return cls(hidden, inter, parallel.tp_rank, parallel.tp_size)

    def create(self, experts: int) -> dict[str, nn.Parameter]:
        """w13 [E, 2I, H / 2] and w2 [E, H, I / 2] bytes, their scales [E, 2I, H / 32] and [E, H, I / 32]."""
        h, i, g = self.hidden, self.inter, MXFP4_GROUP
        shapes = {
            "w13": (experts, 2 * i, h // 2),
            "w2": (experts, h, i // 2),
            "w13_mxfp4_scale": (experts, 2 * i, h // g),
            "w2_mxfp4_scale": (experts, h, i // g),
        }
        params = {
            name: nn.Parameter(torch.empty(shape, dtype=torch.uint8), requires_grad=False)
            for name, shape in shapes.items()
        }
        for name in ("w13_mxfp4_scale", "w2_mxfp4_scale"):
            params[name].e8m0_scale = True  # (dummy weights fill these with a scale, not random bytes)
        return params

    def load(self, param: nn.Parameter, loaded: torch.Tensor, which: str) -> None:
        """Every expert's blocks [E, N, K / 32, 16] or scales [E, N, K / 32]: gate/up with rows alternating
        (GATE_UP) or down (DOWN)."""
        g = MXFP4_GROUP
        is_blocks = not getattr(param, "e8m0_scale", False)  # (the parameter says which: a tensor may lie)
        per_group = g // 2 if is_blocks else 1  # bytes (or scales) a row holds per 32 values
        full_inter = self.inter * self.tp_size
        k_groups = self.hidden // g if which == GATE_UP else full_inter // g
        rows = 2 * full_inter if which == GATE_UP else self.hidden
        want = (param.shape[0], rows, k_groups) + ((g // 2,) if is_blocks else ())
        if tuple(loaded.shape) != want:
            kind = "blocks" if is_blocks else "scales"
            raise ValueError(f"expected MXFP4 {kind} of shape {want}, got {tuple(loaded.shape)}")
        if not is_blocks and loaded.numel() and (top := int(loaded.max())) > MXFP4_MAX_SCALE_BYTE:
            raise ValueError(
                f"MXFP4 scales hold the byte {top} (2**{top - 127}); the kernels take scales up to byte "
                f"{MXFP4_MAX_SCALE_BYTE} (2**{MXFP4_MAX_SCALE_BYTE - 127})"
            )
        loaded = loaded.flatten(2)  # blocks -> [E, N, K / 2]; scales unchanged
        if which == GATE_UP:
            start = self.rank * self.inter
            gate, up = loaded[:, 0::2], loaded[:, 1::2]
            param.data.copy_(
                torch.cat([gate[:, start : start + self.inter], up[:, start : start + self.inter]], 1)
            )
            return
        local = self.inter // g * per_group
        param.data.copy_(loaded.narrow(2, self.rank * local, local))

    def scales(self, w13_scale: torch.Tensor, w2_scale: torch.Tensor) -> ExpertMxfp4:
        return ExpertMxfp4(w13_scale, w2_scale)
