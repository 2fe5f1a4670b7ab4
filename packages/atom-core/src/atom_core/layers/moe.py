"""Sparse MoE: a router picks top-k experts per token; expert MLPs are stacked parameters.

Experts' intermediate dimension is split over tensor-parallel ranks. An fp8 checkpoint's experts are e4m3
with block scales (layers/moe_fp8.py); routers and the shared expert's gate stay unquantized. Routing and
the experts run through atom-kernels' fused MoE (Triton on the GPU: no host sync, so decode steps capture in CUDA graphs; the
per-expert torch loop on the CPU).
"""

from __future__ import annotations

import torch
from torch import nn

from atom_core.config import ParallelConfig
from atom_core.layers.fused import silu_and_mul_linear
from atom_core.layers.joint_linear import JointLinears
from atom_core.layers.linear import ReplicatedLinear, _check, _split
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.moe_fp8 import E4M3, ExpertsFp8
from atom_core.layers.parallel import RankPartial, add_sums, all_reduce, may_defer_reduce
from atom_core.ops import SharedExpert, fused_experts, topk_softmax
from atom_core.quantization import QuantConfig


class SparseMoE(nn.Module):
    def __init__(
        self,
        hidden: int,
        intermediate: int,
        num_experts: int,
        top_k: int,
        *,
        norm_topk_prob: bool,
        dtype,
        parallel: ParallelConfig,
        prefix: str,
        quant_config: QuantConfig | None = None,
        shared_intermediate: int = 0,
    ):
        super().__init__()
        self.prefix = prefix
        common = dict(dtype=dtype, parallel=parallel, quant_config=quant_config)
        self.parallel, self.top_k, self.norm_topk_prob, self.num_experts = (
            parallel,
            top_k,
            norm_topk_prob,
            num_experts,
        )
        self.inter = _split(intermediate, parallel, "moe_intermediate_size")
        self.defer_reduce = False  # see defer_output_reduce
        # routers stay in the model's dtype in every fp8 checkpoint (and DeepSeek's reads its weight)
        self.gate = ReplicatedLinear(
            hidden, num_experts, bias=False, prefix=f"{prefix}.gate", dtype=dtype, parallel=parallel
        )
        self.fp8 = ExpertsFp8.for_layer(quant_config, f"{prefix}.experts", hidden, self.inter, parallel)
        weight_dtype = dtype if self.fp8 is None else E4M3
        self.w13 = nn.Parameter(
            torch.empty(num_experts, 2 * self.inter, hidden, dtype=weight_dtype), requires_grad=False
        )
        self.w2 = nn.Parameter(
            torch.empty(num_experts, hidden, self.inter, dtype=weight_dtype), requires_grad=False
        )
        gate_up = frozenset((e, w) for e in range(num_experts) for w in ("w1", "w3"))
        down = frozenset((e, "w2") for e in range(num_experts))
        stacked = [(self.w13, gate_up), (self.w2, down)]
        if self.fp8 is not None:
            self.w13_scale_inv, self.w2_scale_inv = self.fp8.create_scales(num_experts)
            stacked += [(self.w13_scale_inv, gate_up), (self.w2_scale_inv, down)]
        for param, shards in stacked:
            param.weight_loader, param.expected_shards = self.weight_loader, shards
        # Qwen2-MoE style: every token also goes through one dense expert, scaled by sigmoid(gate(x)).
        self.shared_expert = self.shared_expert_gate = None
        if shared_intermediate:
            self.shared_expert = GatedMLP(
                hidden, shared_intermediate, bias=False, prefix=f"{prefix}.shared_expert", **common
            )
            self.shared_expert_gate = ReplicatedLinear(
                hidden, 1, bias=False, prefix=f"{prefix}.shared_expert_gate", dtype=dtype, parallel=parallel
            )
        # the projections of the block's input as one matmul once loaded (router, shared gate_up and gate)
        shared_in = (
            () if self.shared_expert is None else (self.shared_expert.gate_up_proj, self.shared_expert_gate)
        )
        self.in_projs = JointLinears(self.gate, *shared_in)

    def weight_loader(self, param, loaded, shard_id):
        """shard_id: (expert, "w1" | "w3" | "w2") for the expert's gate, up and down projections, or
        ("all", "w13" | "w2") for every expert's in one tensor: gate_up [E, 2I, H] (gate rows first) or
        down [E, H, I], as fused checkpoints (Qwen3.5-MoE) store them."""
        expert, which = shard_id
        rank, inter = self.parallel.tp_rank, self.inter
        if getattr(param, "block_scale", False):
            return self.fp8.load_scale(param, loaded, expert, which)
        if expert == "all":
            full = inter * self.parallel.tp_size
            if which == "w2":
                _check(loaded, (self.num_experts, param.shape[1], full))
                param.data.copy_(loaded.narrow(2, rank * inter, inter))
            else:
                _check(loaded, (self.num_experts, 2 * full, param.shape[2]))
                gate, up = loaded.split(full, dim=1)
                param.data.copy_(
                    torch.cat([gate.narrow(1, rank * inter, inter), up.narrow(1, rank * inter, inter)], dim=1)
                )
            return
        if which == "w2":
            _check(loaded, (param.shape[1], inter * self.parallel.tp_size))
            param.data[expert].copy_(loaded.narrow(1, rank * inter, inter))
        else:
            _check(loaded, (inter * self.parallel.tp_size, param.shape[2]))
            param.data[expert].narrow(0, 0 if which == "w1" else inter, inter).copy_(
                loaded.narrow(0, rank * inter, inter)
            )

    def route(self, x: torch.Tensor, logits: torch.Tensor | None = None):
        """x: [T, H] -> (weights [T, k] fp32 rounded to x's dtype, as transformers rounds them; expert ids
        [T, k]). The rounding happens in the routing kernel: no conversion launches around it. logits: the
        router's [T, E] output where the caller has it already."""
        logits = self.gate(x) if logits is None else logits
        return topk_softmax(logits, self.top_k, self.norm_topk_prob, round_to=x.dtype)

    def defer_output_reduce(self) -> None:
        """forward returns the routed and shared experts' partial sums added (a RankPartial) for the next
        RMSNorm to reduce: one reduction for both."""
        self.defer_reduce = True
        if (shared := self.shared_mlp()) is not None:
            shared.defer_output_reduce()

    def shared_mlp(self) -> GatedMLP | None:
        """The dense expert every token also goes through, if the block has one."""
        return self.shared_expert

    def experts(
        self, x: torch.Tensor, weights: torch.Tensor, ids: torch.Tensor, shared: SharedExpert | None = None
    ) -> torch.Tensor | RankPartial:
        """x: [T, H], the routing's weights and ids [T, k] -> the routed experts' sum [T, H] over all ranks
        (unreduced, as a RankPartial, where defer_output_reduce asked for it), plus the shared expert's
        term where given (one rank only: it is the whole output, not a rank's share)."""
        scales = None if self.fp8 is None else self.fp8.scales(self.w13_scale_inv, self.w2_scale_inv)
        partial = fused_experts(x, self.w13, self.w2, weights, ids, scales=scales, shared=shared)
        if self.defer_reduce and may_defer_reduce(self.parallel):
            return RankPartial(partial, self.parallel)
        return all_reduce(partial, self.parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor | RankPartial:
        if self.shared_expert is None:
            weights, ids = self.route(x)
            return self.experts(x, weights, ids)
        logits, gate_up, gate = self.in_projs(x)
        weights, ids = self.route(x, logits)
        shared = silu_and_mul_linear(self.shared_expert.down_proj, gate_up)  # the shared expert's output
        if self.parallel.tp_size == 1:
            # the gated shared expert joins the routed experts' combine (no sigmoid, product, sum after it)
            return self.experts(x, weights, ids, SharedExpert(shared, gate))
        out = self.experts(x, weights, ids)
        gate = torch.sigmoid(gate)  # scaled per token by a replicated gate: on partials too
        if isinstance(shared, RankPartial):
            return add_sums(out, RankPartial(gate * shared.partial, shared.parallel))
        return add_sums(out, gate * shared)
