"""Qwen3-Next: a hybrid of Gated DeltaNet layers (linear attention over per-sequence state) and gated full
attention (q_proj doubled into q and a per-head output gate, q/k norm, partial rotary), sparse MoE with a
gated shared expert; every RMSNorm but the DeltaNet's output norm scales by (1 + weight).

config.json's layer_types says each layer's kind ("linear_attention" -> gdn, "full_attention" -> mha; older
configs give full_attention_interval instead); mlp_only_layers and decoder_sparse_step say which MLPs are
sparse, as in Qwen3-MoE.
"""

from __future__ import annotations

from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.layers.attention import SelfAttention
from atom_core.layers.gdn import GatedDeltaNet
from atom_core.layers.norm import RMSNorm
from atom_core.layers.parallel import defer_reductions_to_norms
from atom_core.models.llama import LlamaForCausalLM
from atom_core.models.qwen3_moe import expert_rule, is_sparse_layer, sparse_moe

KINDS = {"linear_attention": "gdn", "full_attention": "mha"}


def layer_types(config: ModelConfig) -> list[str]:
    hf, n = config.hf, config.num_hidden_layers
    types = hf.get("layer_types")
    if types is None:
        interval = hf.get("full_attention_interval", 4)
        types = ["linear_attention" if (i + 1) % interval else "full_attention" for i in range(n)]
    unknown = sorted(set(types) - set(KINDS))
    if unknown or len(types) != n:
        raise ConfigError(
            f"{config.architecture}: layer_types must name each of the {n} layers as one of {sorted(KINDS)}, "
            f"got {len(types)} entries" + (f" with {', '.join(map(repr, unknown))}" if unknown else "")
        )
    return list(types)


class HybridDecoderLayer(nn.Module):
    """Pre-norm residual block whose mixer is linear_attn (GDN, no positions) or self_attn."""

    def __init__(self, config: ModelConfig, mixer: nn.Module, mlp: nn.Module, *, linear: bool):
        super().__init__()
        eps, dtype = config.rms_norm_eps, config.dtype
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, offset=1.0)
        if linear:
            self.linear_attn = mixer
        else:
            self.self_attn = mixer
        self.linear = linear
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, offset=1.0)
        self.mlp = mlp
        defer_reductions_to_norms(mixer, mlp)  # tensor parallel: each all-reduce fused with its norm

    def forward(self, positions, hidden, residual):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.linear_attn(hidden) if self.linear else self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class Qwen3NextForCausalLM(LlamaForCausalLM):
    name_rules = (expert_rule,)
    norm_offset = 1.0
    grouped_gdn_projections = True  # in_proj_qkvz / in_proj_ba (Qwen3.5: one projection per part)

    @classmethod
    def layer_kinds(cls, config: ModelConfig) -> tuple[str, ...]:
        return tuple(KINDS[t] for t in layer_types(config))

    def make_layer(self, config: ModelConfig, ctx: BuildContext, i: int, prefix: str) -> nn.Module:
        linear = layer_types(config)[i] == "linear_attention"
        if linear:
            mixer = GatedDeltaNet(
                config,
                ctx,
                layer_index=i,
                prefix=f"{prefix}.linear_attn",
                grouped_projections=self.grouped_gdn_projections,
            )
        else:
            mixer = SelfAttention(
                config,
                ctx,
                layer_index=i,
                prefix=f"{prefix}.self_attn",
                qk_norm=True,
                qkv_bias=config.attention_bias,
                o_bias=config.attention_bias,
                output_gate=True,
                norm_offset=1.0,
            )
        return HybridDecoderLayer(
            config, mixer, self.make_mlp(config, ctx, i, f"{prefix}.mlp"), linear=linear
        )

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        if not is_sparse_layer(config, layer_index):
            return super().make_mlp(config, ctx, layer_index, prefix)
        return sparse_moe(config, ctx, prefix)

    def mlp_bias(self, config: ModelConfig) -> bool:
        return False

    def skip_weight(self, name: str) -> bool:
        return name.startswith("mtp.") or super().skip_weight(name)  # the MTP draft's (qwen3_next_mtp.py)
