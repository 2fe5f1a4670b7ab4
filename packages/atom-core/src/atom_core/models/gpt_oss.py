"""GPT-OSS: Llama's decoder with attention sinks and biases, alternating sliding and full attention, and
sparse MoE layers whose router and experts carry biases and whose experts use a clamped SwiGLU."""

from __future__ import annotations

import re
from typing import Any

from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.layers.attention import SelfAttention
from atom_core.layers.moe import SparseMoE
from atom_core.layers.moe_mxfp4 import DOWN as MXFP4_DOWN
from atom_core.layers.moe_mxfp4 import GATE_UP as MXFP4_GATE_UP
from atom_core.models.attention_windows import FULL, SLIDING, Windows, windows_from_layer_types
from atom_core.models.llama import LlamaForCausalLM
from atom_core.models.weights import Covering
from atom_core.ops import ExpertActivation

# transformers' GptOssConfig defaults, for the fields a config.json may leave out
_DEFAULT_ROPE = {
    "rope_type": "yarn",
    "factor": 32.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 4096,
}
_DEFAULTS = {
    "num_hidden_layers": 36,
    "num_local_experts": 128,
    "vocab_size": 201088,
    "hidden_size": 2880,
    "intermediate_size": 2880,
    "head_dim": 64,
    "num_attention_heads": 64,
    "num_key_value_heads": 8,
    "sliding_window": 128,
    "max_position_embeddings": 131072,
    "rms_norm_eps": 1e-5,
    "num_experts_per_tok": 4,
    "swiglu_alpha": 1.702,
    "swiglu_limit": 7.0,
    "attention_bias": True,
    "rope_theta": 150000.0,
}


def hf_defaults(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json with transformers' GptOssConfig defaults where it is silent: YaRN rope (theta 150000)
    when neither rope_parameters nor rope_scaling is given, and layer types alternating from a sliding
    first layer."""
    out = {**_DEFAULTS, **hf}
    if not out.get("rope_parameters") and not out.get("rope_scaling"):
        out["rope_parameters"] = {**_DEFAULT_ROPE, "rope_theta": out["rope_theta"]}
    if out.get("layer_types") is None:
        out["layer_types"] = [SLIDING if i % 2 == 0 else FULL for i in range(out["num_hidden_layers"])]
    return out


def gpt_oss_windows(config: ModelConfig) -> Windows:
    """`layer_types`, with `sliding_window` on the sliding layers."""
    return windows_from_layer_types(config, config.hf["layer_types"], config.hf.get("sliding_window"))


_EXPERTS = re.compile(r"^(.*\.mlp)\.experts\.(gate_up_proj|down_proj)(_bias|_blocks|_scales)?$")
_ROUTER = re.compile(r"^(.*\.mlp)\.router\.(weight|bias)$")


def gpt_oss_rule(name: str, num_experts: int):
    """mlp.router.{weight,bias} -> the MoE's gate; mlp.experts.{gate_up_proj,down_proj} (every expert in
    one tensor, [E, in, out], gate and up columns alternating), their _bias, or an MXFP4 checkpoint's
    _blocks and _scales ([E, out, ...], gate and up rows alternating) -> the stacked experts."""
    if (m := _ROUTER.match(name)) is not None:
        return f"{m.group(1)}.gate.{m.group(2)}", None
    if (m := _EXPERTS.match(name)) is None:
        return None
    down, suffix = m.group(2) == "down_proj", m.group(3) or ""
    param = "w2" if down else "w13"
    shards = (
        frozenset((e, "w2") for e in range(num_experts))
        if down
        else frozenset((e, w) for e in range(num_experts) for w in ("w1", "w3"))
    )
    if suffix in ("_blocks", "_scales"):
        target = param if suffix == "_blocks" else f"{param}_mxfp4_scale"
        return f"{m.group(1)}.{target}", Covering(("all", MXFP4_DOWN if down else MXFP4_GATE_UP), shards)
    layout = {
        ("w13", ""): "w13_interleaved_t",
        ("w13", "_bias"): "w13_interleaved",
        ("w2", ""): "w2_t",
        ("w2", "_bias"): "w2",
    }[param, suffix]
    return f"{m.group(1)}.{param}{suffix}", Covering(("all", layout), shards)


class GptOssForCausalLM(LlamaForCausalLM):
    attention_windows = staticmethod(gpt_oss_windows)

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        super().__init__(config, ctx, prefix)
        experts = int(config.hf["num_local_experts"])
        self.name_rules = (lambda name: gpt_oss_rule(name, experts),)

    def make_attention(
        self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str
    ) -> nn.Module:
        return SelfAttention(
            config,
            ctx,
            layer_index=layer_index,
            prefix=prefix,
            qkv_bias=config.attention_bias,
            o_bias=config.attention_bias,
            sliding_window=self.attention_windows(config)[layer_index],
            sinks=True,
        )

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        hf = config.hf
        try:
            activation = ExpertActivation(
                "swiglu_oai", alpha=float(hf["swiglu_alpha"]), limit=float(hf["swiglu_limit"])
            )
        except (TypeError, ValueError) as err:
            raise ConfigError(f"{config.architecture}: swiglu_alpha / swiglu_limit: {err}") from None
        return SparseMoE(
            config.hidden_size,
            config.intermediate_size,
            int(hf["num_local_experts"]),
            int(hf["num_experts_per_tok"]),
            norm_topk_prob=True,  # a softmax over the k largest logits: the k probabilities renormalised
            dtype=config.dtype,
            parallel=ctx.parallel,
            prefix=prefix,
            quant_config=ctx.quant_config,
            router_bias=True,
            expert_bias=True,
            activation=activation,
        )
