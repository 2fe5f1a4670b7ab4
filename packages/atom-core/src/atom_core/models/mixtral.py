"""Mixtral: Llama's decoder with a sparse MoE on every layer (softmax router, top-k renormalised), and
Mistral's optional sliding window on every layer."""

from __future__ import annotations

import re
from functools import partial
from typing import Any

from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ModelConfig
from atom_core.layers.moe import SparseMoE
from atom_core.models.attention_windows import FULL, SLIDING, Windows, windows_from_layer_types
from atom_core.models.llama import LlamaForCausalLM
from atom_core.models.qwen3_moe import fused_expert_rule

# The published layout: block_sparse_moe.experts.E.w1 (gate), w3 (up), w2 (down), and block_sparse_moe.gate
_EXPERT = re.compile(r"^(.*)\.block_sparse_moe\.experts\.(\d+)\.(w1|w2|w3)\.weight(_scale_inv)?$")
_PARAM = {"w1": "w13", "w3": "w13", "w2": "w2"}
_GATE = re.compile(r"^(.*)\.block_sparse_moe\.gate\.weight$")


# transformers' MixtralConfig defaults for the fields a config.json may leave out (ModelConfig's generic
# ones differ: kv heads, norm eps, rotary base, context)
_DEFAULTS = {
    "vocab_size": 32000,
    "hidden_size": 4096,
    "intermediate_size": 14336,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "num_local_experts": 8,
    "num_experts_per_tok": 2,
    "tie_word_embeddings": False,
}
_ROPE_THETA = 1_000_000.0


def hf_defaults(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with transformers' MixtralConfig defaults where it is silent (the rotary base too)."""
    out = {**_DEFAULTS, **hf}
    rope = out.get("rope_parameters") or out.get("rope_scaling")
    if "rope_theta" not in out and not (isinstance(rope, dict) and "rope_theta" in rope):
        out["rope_theta"] = _ROPE_THETA
    return out


def mixtral_windows(config: ModelConfig) -> Windows:
    """`sliding_window` on every layer where set (transformers masks every layer's attention with it),
    else full attention."""
    window = config.hf.get("sliding_window")
    kind = FULL if window is None else SLIDING
    return windows_from_layer_types(config, [kind] * config.num_hidden_layers, window)


def expert_count(config: ModelConfig) -> int:
    """num_local_experts (transformers' MixtralConfig default: 8)."""
    return int(config.hf.get("num_local_experts", 8))


def mixtral_rule(name: str, num_experts: int):
    """block_sparse_moe.experts.E.w{1,3,2}.weight (and an fp8 checkpoint's weight_scale_inv) -> the stacked
    experts' (E, w1|w3|w2) shard; block_sparse_moe.gate -> the router; transformers 5's fused
    mlp.experts.{gate_up_proj,down_proj} -> every expert at once."""
    if (m := _EXPERT.match(name)) is not None:
        shard = m.group(3)
        return f"{m.group(1)}.mlp.{_PARAM[shard]}{m.group(4) or ''}", (int(m.group(2)), shard)
    if (m := _GATE.match(name)) is not None:
        return f"{m.group(1)}.mlp.gate.weight", None
    return fused_expert_rule(name, num_experts)


class MixtralForCausalLM(LlamaForCausalLM):
    attention_windows = staticmethod(mixtral_windows)

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        super().__init__(config, ctx, prefix)
        self.name_rules = (partial(mixtral_rule, num_experts=expert_count(config)),)

    def mlp_bias(self, config: ModelConfig) -> bool:
        return False

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        hf = config.hf
        return SparseMoE(
            config.hidden_size,
            config.intermediate_size,  # each expert's width: Mixtral has no moe_intermediate_size
            expert_count(config),
            int(hf.get("num_experts_per_tok", 2)),  # transformers' MixtralConfig default
            norm_topk_prob=True,  # softmax over all experts, the k kept renormalised
            dtype=config.dtype,
            parallel=ctx.parallel,
            prefix=prefix,
            quant_config=ctx.quant_config,
        )
