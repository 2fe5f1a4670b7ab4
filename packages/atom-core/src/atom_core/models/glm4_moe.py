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

# transformers' Glm4MoeConfig defaults for the fields a config.json may leave out: the model's sizes (where
# ModelConfig's generic defaults differ: kv heads, norm eps, context) and the MoE fields (DeepSeek's readers
# would otherwise take "no experts" or "no dense layer" from their absence)
_DEFAULTS = {
    "vocab_size": 151552,
    "hidden_size": 4096,
    "intermediate_size": 10944,
    "num_hidden_layers": 46,
    "num_attention_heads": 96,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "attention_bias": False,
    "use_qk_norm": False,
    "tie_word_embeddings": False,
    "n_routed_experts": 128,
    "num_experts_per_tok": 8,
    "moe_intermediate_size": 1408,
    "n_shared_experts": 1,
    "first_k_dense_replace": 1,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "routed_scaling_factor": 1.0,
}


def hf_defaults(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with transformers' Glm4MoeConfig defaults where it is silent: the fields above and
    rotary on half of each head."""
    out = {**_DEFAULTS, **hf}
    rope = out.get("rope_parameters") or {}
    if "partial_rotary_factor" not in out and "partial_rotary_factor" not in rope:
        out["partial_rotary_factor"] = 0.5
    return out


class Glm4MoeForCausalLM(DeepseekV3ForCausalLM):
    packed_rules = LLAMA_PACKED  # q/k/v and the dense gate/up are packed, as in Llama

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        self.qk_norm = bool(config.hf.get("use_qk_norm", False))
        super().__init__(config, ctx, prefix)
        experts = int(config.hf["n_routed_experts"])
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
