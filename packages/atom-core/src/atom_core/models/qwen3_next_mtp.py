"""Qwen3-Next's and Qwen3.5's multi-token-prediction (MTP) layer, the speculative draft of those models.

Checkpoint (top level, not under model.): mtp.fc [H, 2H], mtp.pre_fc_norm_embedding, mtp.pre_fc_norm_hidden,
mtp.layers.0.* (a full-attention decoder layer: gated attention with q/k norm, the model's MLP kind: MoE
with a shared expert, or dense for Qwen3.5 dense), mtp.norm. Every norm is zero-centred (1 + w). The
embedding and the head are the target's, handed over by bind_target.

Row i sees the target's final hidden state h_i (after model.norm) and the token after it, t_{i+1}:
    x_i = fc([pre_fc_norm_embedding(Emb(t_{i+1})), pre_fc_norm_hidden(h_i)]) -> layer -> mtp.norm
and head(x_i) predicts t_{i+2}; drafting k > 1 tokens applies the layer again to its own output and the
token it drafted (as vLLM and SGLang chain it). The MTP layer is full attention only: its cache is paged,
whatever the target's GDN layers keep.

Each draft class is its target's model class with this module's init and forward, so the MTP layer's MLP
is built (and its weights named and loaded) exactly as the target's layers are.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.layers.attention import SelfAttention
from atom_core.layers.linear import ReplicatedLinear
from atom_core.layers.norm import RMSNorm
from atom_core.models.qwen3_5 import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM
from atom_core.models.qwen3_next import HybridDecoderLayer, Qwen3NextForCausalLM
from atom_core.models.target_binding import TargetBinding
from atom_core.models.weights import WeightLoadError, load_by_rules

PREFIX = "mtp."


class QwenMTP(TargetBinding):
    """forward(input_ids [T], positions [T], hidden [T, H]) -> draft hidden [T, H] (after mtp.norm);
    compute_logits(hidden) -> [T, vocab] through the target's head. Call bind_target before either (the
    target's embedding and head, not the target class's own, which this draft does not load)."""

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        nn.Module.__init__(self)
        self.check_config(config)
        self.config = config
        h, eps, dtype = config.hidden_size, config.rms_norm_eps, config.dtype
        p = f"{prefix}mtp"
        self.mtp = nn.Module()
        # bf16 even in the FP8 releases (modules_to_not_convert): never quantized
        self.mtp.fc = ReplicatedLinear(
            2 * h, h, bias=False, dtype=dtype, parallel=ctx.parallel, prefix=f"{p}.fc"
        )
        self.mtp.pre_fc_norm_embedding = RMSNorm(h, eps, dtype=dtype, offset=1.0)
        self.mtp.pre_fc_norm_hidden = RMSNorm(h, eps, dtype=dtype, offset=1.0)
        attention = SelfAttention(
            config,
            ctx,
            layer_index=0,  # cache 0 of the draft's own caches
            prefix=f"{p}.layers.0.self_attn",
            qk_norm=True,
            qkv_bias=config.attention_bias,
            o_bias=config.attention_bias,
            output_gate=True,
            norm_offset=1.0,
        )
        # layer index 0 decides dense or sparse, as vLLM and SGLang build the MTP layer
        mlp = self.make_mlp(config, ctx, 0, f"{p}.layers.0.mlp")
        self.mtp.layers = nn.ModuleList([HybridDecoderLayer(config, attention, mlp, linear=False)])
        self.mtp.norm = RMSNorm(h, eps, dtype=dtype, offset=1.0)

    @classmethod
    def layer_kinds(cls, config: ModelConfig) -> tuple[str, ...]:
        return ("mha",)

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        hf = config.hf
        # Qwen3-Next names it num_nextn_predict_layers, Qwen3.5 mtp_num_hidden_layers; both default to 1
        layers = hf.get("mtp_num_hidden_layers", hf.get("num_nextn_predict_layers", 1))
        if layers != 1:
            raise ConfigError(
                f"{config.architecture} declares {layers} MTP layers: ATOM drafts with exactly one "
                "(the published checkpoints have one)"
            )
        if hf.get("mtp_use_dedicated_embeddings", False):
            raise ConfigError(
                f"{config.architecture}: mtp_use_dedicated_embeddings is not supported (the MTP layer shares "
                "the target's embedding, as every published checkpoint does)"
            )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        m = self.mtp
        embedded = m.pre_fc_norm_embedding(self.embed_input_ids(input_ids))
        x = m.fc(torch.cat([embedded, m.pre_fc_norm_hidden(hidden)], dim=-1))
        x, residual = m.layers[0](positions, x, None)
        x, _ = m.norm(x, residual)
        return x

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        seen = []

        def skip(name: str) -> bool:
            if not name.startswith(PREFIX):
                return True
            seen.append(name)
            return False

        filled = load_by_rules(self, weights, self.packed_rules, name_rules=self.name_rules, skip=skip)
        if not seen:
            raise WeightLoadError(
                "the checkpoint has no MTP layer tensors (mtp.*): speculative method 'mtp' cannot draft "
                "without them"
            )
        return filled


class Qwen3NextMTP(QwenMTP, Qwen3NextForCausalLM):
    pass


class Qwen3_5MTP(QwenMTP, Qwen3_5ForCausalLM):
    pass


class Qwen3_5MoeMTP(QwenMTP, Qwen3_5MoeForCausalLM):
    pass
