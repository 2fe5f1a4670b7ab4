"""Qwen3.5 text models (dense and MoE): Qwen3-Next's hybrid with one input projection per DeltaNet part
(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) and interleaved MRoPE on the full-attention layers.

Text-only positions are 1-D: with the temporal, height and width positions all equal, the interleaved
MRoPE sections rotate every frequency by the same position, which is the plain (partial) rotary used here.
Qwen3.5-MoE routes by softmax top-k, always renormalised, beside a gated shared expert; its experts load
from per-expert keys or from fused 3-D experts.gate_up_proj / experts.down_proj tensors.
"""

from __future__ import annotations

from functools import partial

from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ModelConfig
from atom_core.models.qwen3_moe import (
    expert_rule,
    fused_expert_rule,
    is_sparse_layer,
    num_experts,
    sparse_moe,
)
from atom_core.models.qwen3_next import Qwen3NextForCausalLM


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    grouped_gdn_projections = False


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        super().__init__(config, ctx, prefix)
        self.name_rules = (expert_rule, partial(fused_expert_rule, num_experts=num_experts(config)))

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        if not is_sparse_layer(config, layer_index):
            return super().make_mlp(config, ctx, layer_index, prefix)
        return sparse_moe(config, ctx, prefix, norm_topk_prob=True)
