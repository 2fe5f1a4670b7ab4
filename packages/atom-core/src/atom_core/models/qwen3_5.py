"""Qwen3.5 text models (dense and MoE): Qwen3-Next's hybrid with one input projection per DeltaNet part
(in_proj_qkv, in_proj_z, in_proj_b, in_proj_a) and interleaved MRoPE on the full-attention layers.

Text-only positions are 1-D: with the temporal, height and width positions all equal, the interleaved
MRoPE sections rotate every frequency by the same position, which is the plain (partial) rotary used here.
A caller that has [3, T] positions (rows T, H, W) passes them as they are: the full-attention layers then
rotate by interleaved MRoPE (rope_parameters' mrope_section).
Qwen3.5-MoE routes by softmax top-k, always renormalised, beside a gated shared expert; its experts load
from per-expert keys or from fused 3-D experts.gate_up_proj / experts.down_proj tensors.

The published checkpoints are *ForConditionalGeneration (text_config, a vision tower): served text-only,
the language model's weights under model.language_model.* load as model.*, the vision tower's are skipped
(one log line), and the server refuses image and video inputs by name.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from functools import partial

import torch
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

logger = logging.getLogger("atom.models")


class Qwen3_5ForCausalLM(Qwen3NextForCausalLM):
    grouped_gdn_projections = False


class Qwen3_5MoeForCausalLM(Qwen3_5ForCausalLM):
    @property
    def name_rules(self):  # per-expert keys, or fused 3-D experts covering every expert's shards
        return (expert_rule, partial(fused_expert_rule, num_experts=num_experts(self.config)))

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        if not is_sparse_layer(config, layer_index):
            return super().make_mlp(config, ctx, layer_index, prefix)
        return sparse_moe(config, ctx, prefix, norm_topk_prob=True)


class TextOnly:
    """Mixin for a multimodal checkpoint served by its language model alone."""

    vision_prefixes: tuple[str, ...] = ("model.visual.",)  # the tensors of the vision tower (not loaded)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        skipped = []

        def language_model(pairs):
            for name, tensor in pairs:
                if name.startswith(self.vision_prefixes):
                    skipped.append(name)
                    continue
                yield name.replace("model.language_model.", "model.", 1), tensor

        filled = super().load_weights(language_model(weights))
        if skipped:
            logger.info(
                "served text-only: skipped the vision tower's %d tensors (%s)",
                len(skipped),
                ", ".join(f"{p}*" for p in self.vision_prefixes),
            )
        return filled


class Qwen3_5ForConditionalGeneration(TextOnly, Qwen3_5ForCausalLM):
    pass


class Qwen3_5MoeForConditionalGeneration(TextOnly, Qwen3_5MoeForCausalLM):
    pass
