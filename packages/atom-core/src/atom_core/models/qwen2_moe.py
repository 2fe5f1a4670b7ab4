"""Qwen2-MoE: q/k/v biases (no o_proj bias), sparse MoE layers with a gated shared expert."""

from __future__ import annotations

from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ModelConfig
from atom_core.models.attention_windows import qwen2_moe_windows
from atom_core.models.llama import LlamaForCausalLM
from atom_core.models.qwen3_moe import expert_rule, is_sparse_layer, sparse_moe


class Qwen2MoeForCausalLM(LlamaForCausalLM):
    name_rules = (expert_rule,)
    attention_windows = staticmethod(qwen2_moe_windows)

    def attention_biases(self, config: ModelConfig) -> tuple[bool, bool]:
        return bool(config.hf.get("qkv_bias", True)), False

    def mlp_bias(self, config: ModelConfig) -> bool:
        return False

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        if not is_sparse_layer(config, layer_index):
            return super().make_mlp(config, ctx, layer_index, prefix)
        return sparse_moe(config, ctx, prefix)
