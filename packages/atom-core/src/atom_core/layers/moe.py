"""Sparse MoE: a router picks top-k experts per token; expert MLPs are stacked parameters.

Experts' intermediate dimension is split over tensor-parallel ranks. The expert computation here is a
correct torch path (one matmul pair per expert hit); the fused MoE kernel replaces it when present.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.config import ParallelConfig
from atom_core.layers.linear import ReplicatedLinear, _check, _split
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.parallel import all_reduce
from atom_core.ops import silu_and_mul


class SparseMoE(nn.Module):
    def __init__(self, hidden: int, intermediate: int, num_experts: int, top_k: int, *, norm_topk_prob: bool,
                 dtype, parallel: ParallelConfig, shared_intermediate: int = 0):  # fmt: skip
        super().__init__()
        self.parallel, self.top_k, self.norm_topk_prob, self.num_experts = (
            parallel,
            top_k,
            norm_topk_prob,
            num_experts,
        )
        self.inter = _split(intermediate, parallel, "moe_intermediate_size")
        self.gate = ReplicatedLinear(hidden, num_experts, bias=False, dtype=dtype, parallel=parallel)
        self.w13 = nn.Parameter(
            torch.empty(num_experts, 2 * self.inter, hidden, dtype=dtype), requires_grad=False
        )
        self.w2 = nn.Parameter(torch.empty(num_experts, hidden, self.inter, dtype=dtype), requires_grad=False)
        self.w13.weight_loader = self.weight_loader
        self.w2.weight_loader = self.weight_loader
        self.w13.expected_shards = frozenset((e, w) for e in range(num_experts) for w in ("w1", "w3"))
        self.w2.expected_shards = frozenset((e, "w2") for e in range(num_experts))
        # Qwen2-MoE style: every token also goes through one dense expert, scaled by sigmoid(gate(x)).
        self.shared_expert = self.shared_expert_gate = None
        if shared_intermediate:
            self.shared_expert = GatedMLP(
                hidden, shared_intermediate, bias=False, dtype=dtype, parallel=parallel
            )
            self.shared_expert_gate = ReplicatedLinear(hidden, 1, bias=False, dtype=dtype, parallel=parallel)

    def weight_loader(self, param, loaded, shard_id):
        """shard_id: (expert, "w1" | "w3" | "w2") for the expert's gate, up and down projections."""
        expert, which = shard_id
        rank, inter = self.parallel.tp_rank, self.inter
        if which == "w2":
            _check(loaded, (param.shape[1], inter * self.parallel.tp_size))
            param.data[expert].copy_(loaded.narrow(1, rank * inter, inter))
        else:
            _check(loaded, (inter * self.parallel.tp_size, param.shape[2]))
            param.data[expert].narrow(0, 0 if which == "w1" else inter, inter).copy_(
                loaded.narrow(0, rank * inter, inter)
            )

    def _experts_static(self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """The experts with shapes fixed by x alone (no host sync), for CUDA-graph capture of decode steps.

        Few (token, expert) pairs: gather those experts' weights. Otherwise run every expert on every token
        with its routing weight (zero where not chosen): each expert's weights are read once, as the
        sparse path reads them when most experts are hit.
        """
        tokens, k = ids.shape
        if tokens * k < self.num_experts:
            h = torch.einsum("tkoh,th->tko", self.w13[ids], x)  # [T, k, 2I]
            h = silu_and_mul(h.reshape(tokens * k, -1)).view(tokens, k, -1)
            return torch.einsum("tkhi,tki->th", self.w2[ids] * weights[..., None, None], h)
        dense = torch.zeros(tokens, self.num_experts, dtype=weights.dtype, device=x.device)
        dense.scatter_(1, ids, weights)  # [T, E]
        out = torch.zeros_like(x)
        for expert in range(self.num_experts):
            h = silu_and_mul(F.linear(x, self.w13[expert]))
            out += F.linear(h, self.w2[expert]) * dense[:, expert, None]
        return out

    def route(self, x: torch.Tensor):
        """x: [T, H] -> (weights [T, k] in x's dtype, expert ids [T, k])."""
        probs = F.softmax(self.gate(x).float(), dim=-1)
        weights, ids = probs.topk(self.top_k, dim=-1)
        if self.norm_topk_prob:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        return weights.to(x.dtype), ids

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(x)
        if x.is_cuda and torch.cuda.is_current_stream_capturing():
            out = self._experts_static(x, weights, ids)
        else:
            out = torch.zeros_like(x)
            for expert in ids.unique().tolist():  # host sync: only the experts hit run
                token, slot = (ids == expert).nonzero(as_tuple=True)
                h = silu_and_mul(F.linear(x[token], self.w13[expert]))
                out.index_add_(0, token, F.linear(h, self.w2[expert]) * weights[token, slot, None])
        out = all_reduce(out, self.parallel)
        if self.shared_expert is not None:  # its down projection reduces over ranks itself
            out = out + torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return out
