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
from atom_core.layers.moe_mxfp4 import DOWN as MXFP4_DOWN
from atom_core.layers.moe_mxfp4 import GATE_UP as MXFP4_GATE_UP
from atom_core.layers.moe_mxfp4 import ExpertsMxfp4
from atom_core.layers.parallel import RankPartial, add_sums, all_reduce, may_defer_reduce
from atom_core.ops import SILU, ExpertActivation, ExpertBiases, SharedExpert, fused_experts, topk_softmax
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
        router_bias: bool = False,
        expert_bias: bool = False,
        activation: ExpertActivation = SILU,
    ):
        """router_bias: the router's linear has a bias (GPT-OSS); expert_bias: each expert adds a bias after
        its gate/up and its down matmul (GPT-OSS); activation: how an expert combines gate and up
        (silu(gate) * up, or GPT-OSS's clamped swiglu_oai)."""
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
        self.activation = activation
        # routers stay in the model's dtype in every fp8 checkpoint (and DeepSeek's reads its weight)
        self.gate = ReplicatedLinear(
            hidden, num_experts, bias=router_bias, prefix=f"{prefix}.gate", dtype=dtype, parallel=parallel
        )
        self.fp8 = ExpertsFp8.for_layer(quant_config, f"{prefix}.experts", hidden, self.inter, parallel)
        self.mxfp4 = ExpertsMxfp4.for_layer(quant_config, f"{prefix}.experts", hidden, self.inter, parallel)
        gate_up = frozenset((e, w) for e in range(num_experts) for w in ("w1", "w3"))
        down = frozenset((e, "w2") for e in range(num_experts))
        if self.mxfp4 is not None:  # bytes and their e8m0 scales
            params = self.mxfp4.create(num_experts)
            self.w13, self.w2 = params["w13"], params["w2"]
            self.w13_mxfp4_scale, self.w2_mxfp4_scale = params["w13_mxfp4_scale"], params["w2_mxfp4_scale"]
            stacked = [(self.w13, gate_up), (self.w2, down)]
            stacked += [(self.w13_mxfp4_scale, gate_up), (self.w2_mxfp4_scale, down)]
        else:
            weight_dtype = dtype if self.fp8 is None else E4M3
            self.w13 = nn.Parameter(
                torch.empty(num_experts, 2 * self.inter, hidden, dtype=weight_dtype), requires_grad=False
            )
            self.w2 = nn.Parameter(
                torch.empty(num_experts, hidden, self.inter, dtype=weight_dtype), requires_grad=False
            )
            stacked = [(self.w13, gate_up), (self.w2, down)]
        if self.fp8 is not None:
            self.w13_scale_inv, self.w2_scale_inv = self.fp8.create_scales(num_experts)
            stacked += [(self.w13_scale_inv, gate_up), (self.w2_scale_inv, down)]
        self.w13_bias = self.w2_bias = None
        if expert_bias:  # in the model's dtype, split as the weights are; w2's full on rank 0 only
            self.w13_bias = nn.Parameter(
                torch.empty(num_experts, 2 * self.inter, dtype=dtype), requires_grad=False
            )
            self.w2_bias = nn.Parameter(torch.empty(num_experts, hidden, dtype=dtype), requires_grad=False)
            stacked += [(self.w13_bias, gate_up), (self.w2_bias, down)]
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
        down [E, H, I], as fused checkpoints (Qwen3.5-MoE) store them; ("all", "w13_interleaved_t" |
        "w2_t"): GPT-OSS's [E, H, 2I] with gate and up columns alternating, and [E, I, H]. The biases
        (w13_bias [E, 2I], w2_bias [E, H]) load with ("all", "w13" | "w13_interleaved" | "w2"); MXFP4
        experts' blocks and scales with ("all", moe_mxfp4.GATE_UP | moe_mxfp4.DOWN)."""
        expert, which = shard_id
        rank, inter = self.parallel.tp_rank, self.inter
        if getattr(param, "block_scale", False):
            return self.fp8.load_scale(param, loaded, expert, which)
        if param is self.w13_bias or param is self.w2_bias:
            return self._load_bias(param, loaded, which)
        if self.mxfp4 is not None:
            if expert != "all" or which not in (MXFP4_GATE_UP, MXFP4_DOWN):
                raise ValueError(
                    "the experts are MXFP4 (config.json's quantization_config): they load from every "
                    "expert's *_blocks and *_scales, not from a tensor in the model's dtype"
                )
            return self.mxfp4.load(param, loaded, which)
        if which == "w13_interleaved_t":  # [E, H, 2I], gate and up alternating -> [E, 2I, H], gate rows first
            _check(loaded, (self.num_experts, param.shape[2], 2 * inter * self.parallel.tp_size))
            loaded, which = _deinterleave(loaded.transpose(1, 2)), "w13"
        elif which == "w2_t":
            _check(loaded, (self.num_experts, inter * self.parallel.tp_size, param.shape[1]))
            loaded, which = loaded.transpose(1, 2), "w2"
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

    def _load_bias(self, param, loaded, which: str) -> None:
        """Every expert's bias: gate/up [E, 2I] (gate half first, or alternating), down [E, H]. The down
        bias is added once to the sum over ranks: rank 0 holds it, the others zeros."""
        rank, inter, full = self.parallel.tp_rank, self.inter, self.inter * self.parallel.tp_size
        if which == "w2":
            _check(loaded, tuple(param.shape))
            param.data.copy_(loaded if rank == 0 else torch.zeros_like(loaded))
            return
        _check(loaded, (self.num_experts, 2 * full))
        if which == "w13_interleaved":
            loaded = _deinterleave(loaded)
        gate, up = loaded.split(full, dim=1)
        param.data.copy_(
            torch.cat([gate.narrow(1, rank * inter, inter), up.narrow(1, rank * inter, inter)], 1)
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
        biases = None if self.w13_bias is None else ExpertBiases(self.w13_bias, self.w2_bias)
        mxfp4 = None if self.mxfp4 is None else self.mxfp4.scales(self.w13_mxfp4_scale, self.w2_mxfp4_scale)
        partial = fused_experts(
            x, self.w13, self.w2, weights, ids, scales=scales, shared=shared, activation=self.activation,
            biases=biases, mxfp4=mxfp4,
        )  # fmt: skip
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


def _deinterleave(t: torch.Tensor) -> torch.Tensor:
    """[E, 2I, ...] with gate and up rows alternating (gate first) -> gate rows, then up rows."""
    return torch.cat([t[:, 0::2], t[:, 1::2]], dim=1)
