"""Qwen3-MoE: Qwen3 with sparse MoE MLPs on the layers config.json marks sparse."""

from __future__ import annotations

import re

from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ModelConfig
from atom_core.layers.moe import SparseMoE
from atom_core.models.attention_windows import qwen3_moe_windows
from atom_core.models.qwen3 import Qwen3ForCausalLM
from atom_core.models.weights import Covering, WeightLoadError

_EXPERT = re.compile(r"^(.*\.mlp)\.experts\.(\d+)\.(gate|up|down)_proj\.weight(_scale_inv)?$")
_EXPERT_PARAM = {"gate": ("w13", "w1"), "up": ("w13", "w3"), "down": ("w2", "w2")}


def expert_rule(name: str):
    """model.layers.N.mlp.experts.E.{gate,up,down}_proj.weight -> the stacked expert parameter, (E, w1|w3|w2);
    an fp8 checkpoint's weight_scale_inv -> the stacked scales (w13_scale_inv, w2_scale_inv)."""
    if (m := _EXPERT.match(name)) is None:
        return None
    param, shard = _EXPERT_PARAM[m.group(3)]
    return f"{m.group(1)}.{param}{m.group(4) or ''}", (int(m.group(2)), shard)


_FUSED = re.compile(r"^(.*\.mlp)\.experts\.(gate_up_proj|down_proj)(_scale_inv)?$")


def fused_expert_rule(name: str, num_experts: int):
    """model.layers.N.mlp.experts.{gate_up_proj,down_proj} (every expert in one 3-D tensor) -> the stacked
    parameter, filling all its experts' shards."""
    if (m := _FUSED.match(name)) is None:
        return None
    if m.group(3):
        raise WeightLoadError(
            f"checkpoint tensor {name!r}: fp8 experts stored fused (one 3-D tensor) are not supported; ATOM "
            "loads fp8 experts per expert (experts.E.{gate,up,down}_proj.weight_scale_inv)"
        )
    if m.group(2) == "down_proj":
        return f"{m.group(1)}.w2", Covering(("all", "w2"), frozenset((e, "w2") for e in range(num_experts)))
    shards = frozenset((e, w) for e in range(num_experts) for w in ("w1", "w3"))
    return f"{m.group(1)}.w13", Covering(("all", "w13"), shards)


def num_experts(config: ModelConfig) -> int:
    """Hub checkpoints say num_experts; transformers 5 writes num_local_experts."""
    return int(config.hf.get("num_experts") or config.hf.get("num_local_experts") or 0)


def is_sparse_layer(config: ModelConfig, layer_index: int) -> bool:
    hf = config.hf
    step = hf.get("decoder_sparse_step", 1) or 1
    return (
        layer_index not in (hf.get("mlp_only_layers") or [])
        and num_experts(config) > 0
        and (layer_index + 1) % step == 0
    )


def sparse_moe(
    config: ModelConfig, ctx: BuildContext, prefix: str, *, norm_topk_prob: bool | None = None
) -> SparseMoE:
    """The MoE block config.json describes (Qwen2-MoE's shared expert included when it has one).
    norm_topk_prob: the family's rule where config.json does not say (Qwen3.5-MoE always renormalises)."""
    hf = config.hf
    if norm_topk_prob is None:
        norm_topk_prob = bool(hf.get("norm_topk_prob", False))
    return SparseMoE(
        config.hidden_size,
        hf["moe_intermediate_size"],
        num_experts(config),
        hf["num_experts_per_tok"],
        norm_topk_prob=norm_topk_prob,
        dtype=config.dtype,
        parallel=ctx.parallel,
        prefix=prefix,
        quant_config=ctx.quant_config,
        shared_intermediate=hf.get("shared_expert_intermediate_size", 0),
    )


class Qwen3MoeForCausalLM(Qwen3ForCausalLM):
    name_rules = (expert_rule,)
    attention_windows = staticmethod(qwen3_moe_windows)

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        if not is_sparse_layer(config, layer_index):
            return super().make_mlp(config, ctx, layer_index, prefix)
        return sparse_moe(config, ctx, prefix)
