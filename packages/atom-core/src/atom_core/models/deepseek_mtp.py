"""DeepSeek-V3's multi-token-prediction (MTP) layer, the speculative draft of DeepseekV3ForCausalLM.

Checkpoint: `model.layers.{L}.*` with L = num_hidden_layers (published V3: 61): enorm, hnorm, eh_proj, a
decoder layer (MLA attention; MoE or dense as layer L would be), shared_head.norm. Its copies of the
embedding and the head (`embed_tokens`, `shared_head.head`) are not loaded: the target's are used, handed
over by bind_target, as vLLM and SGLang do.

Row i sees the target's final hidden state h_i (after model.norm) and the token after it, t_{i+1}:
    x_i = eh_proj([enorm(Emb(t_{i+1})), hnorm(h_i)]) -> decoder layer -> shared_head.norm
and head(x_i) predicts t_{i+2}. Drafting k > 1 tokens applies the one layer again on the draft's own
output (after shared_head.norm, as transformers' MtpModel chains it) and the token it drafted.
Convention: the embedding at position 0 is kept, as transformers, SGLang and Megatron keep it (vLLM zeroes
it). Outputs are the same either way; only the draft's guesses at the first rows differ.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.layers.linear import ReplicatedLinear
from atom_core.layers.norm import RMSNorm
from atom_core.models.deepseek_v2 import DeepseekV3ForCausalLM
from atom_core.models.llama import DecoderLayer
from atom_core.models.target_binding import TargetBinding
from atom_core.models.weights import WeightLoadError, load_by_rules


class MTPBlock(DecoderLayer):
    """A decoder layer with the MTP inputs' norms and projection before it and the shared head's norm after."""

    def __init__(
        self, config: ModelConfig, self_attn: nn.Module, mlp: nn.Module, ctx: BuildContext, prefix: str
    ):
        super().__init__(config, self_attn, mlp)
        h, eps, dtype = config.hidden_size, config.rms_norm_eps, config.dtype
        self.enorm = RMSNorm(h, eps, dtype=dtype)
        self.hnorm = RMSNorm(h, eps, dtype=dtype)
        # bf16 without a scale even in the FP8 release: never quantized
        self.eh_proj = ReplicatedLinear(
            2 * h, h, bias=False, dtype=dtype, parallel=ctx.parallel, prefix=f"{prefix}.eh_proj"
        )
        self.shared_head = nn.Module()
        self.shared_head.norm = RMSNorm(h, eps, dtype=dtype)


class DeepseekMTP(TargetBinding, nn.Module):
    """forward(input_ids [T], positions [T], hidden [T, H]) -> draft hidden [T, H] (after shared_head.norm);
    compute_logits(hidden) -> [T, vocab] through the target's head. Call bind_target before either."""

    target_class = DeepseekV3ForCausalLM

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        super().__init__()
        self.check_config(config)
        self.config = config
        self.index = config.num_hidden_layers  # the MTP layer's index in the checkpoint
        p = f"{prefix}model.layers.{self.index}"
        block = MTPBlock(
            config,
            self.target_class.make_mtp_attention(config, ctx, 0, f"{p}.self_attn"),  # the draft's cache 0
            self.target_class.make_deepseek_mlp(config, ctx, self.index, f"{p}.mlp"),
            ctx,
            p,
        )
        self.model = nn.Module()
        self.model.layers = nn.ModuleDict({str(self.index): block})  # parameter names as in the checkpoint
        self.block = block

    @classmethod
    def layer_kinds(cls, config: ModelConfig) -> tuple[str, ...]:
        return cls.target_class.layer_kinds(config)[:1]  # the target's attention kind

    @staticmethod
    def check_config(config: ModelConfig) -> None:
        layers = config.hf.get("num_nextn_predict_layers") or 0
        if layers < 1:
            raise ConfigError(
                f"{config.architecture} checkpoint has no MTP layer (num_nextn_predict_layers is {layers}): "
                "speculative method 'mtp' drafts with it"
            )
        if layers > 1:
            raise ConfigError(
                f"{config.architecture} has num_nextn_predict_layers={layers}: ATOM drafts with one MTP layer "
                "(published DeepSeek-V3 has one); more are not supported"
            )

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
        b = self.block
        x = b.eh_proj(torch.cat([b.enorm(self.embed_input_ids(input_ids)), b.hnorm(hidden)], dim=-1))
        x, residual = b(positions, x, None)
        x, _ = b.shared_head.norm(x, residual)
        return x

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        mine = f"model.layers.{self.index}."
        shared = (f"{mine}embed_tokens.", f"{mine}shared_head.head.")  # the target's, loaded there
        seen = []

        def skip(name: str) -> bool:
            if not name.startswith(mine) or name.startswith(shared) or "rotary_emb.inv_freq" in name:
                return True
            seen.append(name)
            return False

        target = self.target_class
        filled = load_by_rules(self, weights, target.packed_rules, name_rules=target.name_rules, skip=skip)
        if not seen:
            raise WeightLoadError(
                f"the checkpoint has no MTP layer tensors ({mine}*) although its config declares "
                "num_nextn_predict_layers: speculative method 'mtp' cannot draft without them"
            )
        return filled
