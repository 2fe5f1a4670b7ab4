"""Linears that read one input, run as one matmul once their weights are loaded.

At decode's few rows a linear is a read of its weight plus a kernel launch, and the launches add up: a
layer that projects its input several ways (GDN's q|k|v, z, b and a; a router beside its shared
expert's gate_up and gate; MLA's query and latent projections) pays one for each. `JointLinears` leaves
the members as they are while the checkpoint loads (their names, shards and tensor-parallel slices stay
the checkpoint's), then (`join`, called by the loader's finish_loading) concatenates the weights of the
members that can run together into one [sum of N, K] matrix; the members' weights become views of it,
so memory does not grow. Members join when they are unquantized, of one dtype and device, all with a
bias or all without, and read the whole input (replicated or column-parallel: every rank holds the same
input). A member that cannot join (an fp8 projection, say) runs alone, as before.
"""

from __future__ import annotations

import torch

from atom_core.layers.linear import LinearBase, RowParallelLinear
from atom_core.ops import linear
from atom_core.quantization.unquantized import UnquantizedLinearMethod


class JointLinears:
    """members: linears of one input (not registered here: each stays its owner's submodule).

    __call__(x [T, K]) -> each member's output [T, N_i] in member order; a joined member's output is a
    view of the joint output (rows strided by the joint width, last dimension contiguous)."""

    def __init__(self, *members: LinearBase):
        self.members = members
        self.joined: tuple[int, ...] = ()  # indices of the members run as one matmul
        self.weight: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None

    def _can_join(self, member: LinearBase, first: LinearBase) -> bool:
        return (
            type(member.quant_method) is UnquantizedLinearMethod
            and not isinstance(member, RowParallelLinear)
            and member.in_local == first.in_local
            and member.weight.dtype == first.weight.dtype
            and member.weight.device == first.weight.device
            and (member.bias is None) == (first.bias is None)
        )

    def join(self) -> None:
        """Concatenate the joinable members' weights (after loading: their values are final)."""
        candidates = [m for m in self.members if type(m.quant_method) is UnquantizedLinearMethod]
        if not candidates:
            return
        first = candidates[0]
        joined = tuple(i for i, m in enumerate(self.members) if self._can_join(m, first))
        if len(joined) < 2:
            return
        parts = [self.members[i] for i in joined]
        self.weight = torch.cat([m.weight.data for m in parts])
        self.bias = None if first.bias is None else torch.cat([m.bias.data for m in parts])
        row = 0
        for m in parts:  # the members' parameters now live in the joint tensors
            rows = m.weight.shape[0]
            m.weight.data = self.weight[row : row + rows]
            if m.bias is not None:
                m.bias.data = self.bias[row : row + rows]
            row += rows
        self.joined = joined

    def __call__(self, x: torch.Tensor) -> list[torch.Tensor]:
        if not self.joined:
            return [m(x) for m in self.members]
        outputs: list[torch.Tensor | None] = [None] * len(self.members)
        y = linear(x, self.weight, self.bias)
        row = 0
        for i in self.joined:
            rows = self.members[i].weight.shape[0]
            outputs[i] = y[..., row : row + rows]
            row += rows
        for i, m in enumerate(self.members):
            if outputs[i] is None:
                outputs[i] = m(x)
        return outputs
