"""GLM-4.5 / 4.6 (Glm4MoeForCausalLM): Llama's attention with q/k/v biases (o_proj none), optional q/k norms
and rotary on part of each head, then DeepSeek-V3's MoE (sigmoid grouped routing with
e_score_correction_bias, shared experts, routed_scaling_factor) after first_k_dense_replace dense layers.
The MTP layer a checkpoint carries after its decoder layers is the draft's (Glm4MoeMTP)."""

from __future__ import annotations

from functools import partial
from typing import Any

from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ModelConfig
from atom_core.models.deepseek_mtp import DeepseekMTP
from atom_core.models.deepseek_v2 import DeepseekV3ForCausalLM
from atom_core.models.llama import LlamaForCausalLM
from atom_core.models.qwen3_moe import expert_rule, fused_expert_rule
from atom_core.models.weights import LLAMA_PACKED


def hf_defaults(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with transformers' Glm4MoeConfig default where it is silent: rotary on half of each head."""
    rope = hf.get("rope_parameters") or {}
    if "partial_rotary_factor" in hf or "partial_rotary_factor" in rope:
        return hf
    return {**hf, "partial_rotary_factor": 0.5}


class Glm4MoeForCausalLM(DeepseekV3ForCausalLM):
    packed_rules = LLAMA_PACKED  # q/k/v and the dense gate/up are packed, as in Llama

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        self.qk_norm = bool(config.hf.get("use_qk_norm", False))
        super().__init__(config, ctx, prefix)
        experts = int(config.hf.get("n_routed_experts") or 0)
        self.name_rules = (expert_rule, partial(fused_expert_rule, num_experts=experts))

    @classmethod
    def layer_kinds(cls, config: ModelConfig) -> tuple[str, ...]:
        return ("mha",) * config.num_hidden_layers

    def attention_biases(self, config: ModelConfig) -> tuple[bool, bool]:
        return config.attention_bias, False

    def make_attention(
        self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str
    ) -> nn.Module:
        return LlamaForCausalLM.make_attention(self, config, ctx, layer_index, prefix)

    @classmethod
    def make_mtp_attention(
        cls, config: ModelConfig, ctx: BuildContext, cache_index: int, prefix: str
    ) -> nn.Module:
        from atom_core.layers.attention import SelfAttention

        return SelfAttention(
            config,
            ctx,
            layer_index=cache_index,
            prefix=prefix,
            qk_norm=bool(config.hf.get("use_qk_norm", False)),
            qkv_bias=config.attention_bias,
        )


class Glm4MoeMTP(DeepseekMTP):
    """GLM-4.5's MTP layer: DeepSeek-V3's structure around a GLM decoder layer."""

    target_class = Glm4MoeForCausalLM
