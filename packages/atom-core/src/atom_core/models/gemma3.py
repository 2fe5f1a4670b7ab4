"""Gemma 3 text (Gemma3ForCausalLM; Gemma3ForConditionalGeneration served text-only, as Qwen3.5's).

Llama's decoder with: sandwich norms (a norm after attention and after the MLP, before each residual add,
besides the ones before them), every norm zero-centred (scales by 1 + weight), q/k norms, a softmax scale of
query_pre_attn_scalar ** -0.5, `layer_types` alternating sliding and full attention (5:1 by default) whose
rotary bases differ (rope_parameters per layer type: local 10k, global 1M with linear scaling in the larger
models), a GELU-tanh gated MLP, embeddings scaled by sqrt(hidden) (rounded to the model's dtype, as
transformers rounds it), tied embeddings, and final-logit soft-capping where the config sets it.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig, RopeConfig
from atom_core.layers.attention import SelfAttention
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.norm import RMSNorm
from atom_core.models.attention_windows import FULL, SLIDING, Windows, windows_from_layer_types
from atom_core.models.llama import LlamaForCausalLM
from atom_core.models.qwen3_5 import TextOnly

_THETA = {FULL: 1_000_000.0, SLIDING: 10_000.0}  # transformers' Gemma3TextConfig defaults
_ACTIVATIONS = ("gelu_pytorch_tanh", "gelu_tanh")


def hf_defaults(hf: dict[str, Any]) -> dict[str, Any]:
    """config.json as transformers' Gemma3TextConfig reads it: its defaults where silent, layer_types from
    sliding_window_pattern (every 6th layer full) where absent, and rope_parameters per layer type from the
    older rope_theta, rope_local_base_freq and rope_scaling (the global layers' scaling) where given so."""
    out = {
        # the sizes: the published multimodal configs leave some to these (gemma-3-4b's text_config names
        # no vocab_size, num_attention_heads or num_key_value_heads)
        "vocab_size": 262208,
        "hidden_size": 2304,
        "intermediate_size": 9216,
        "num_hidden_layers": 26,
        "num_attention_heads": 8,
        "num_key_value_heads": 4,
        "max_position_embeddings": 131072,
        "head_dim": 256,  # (not hidden / heads, as ModelConfig would take it)
        "query_pre_attn_scalar": 256,
        "sliding_window": 4096,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        **hf,
    }
    if out.get("layer_types") is None:
        pattern = out.get("sliding_window_pattern", 6)
        out["layer_types"] = [SLIDING if (i + 1) % pattern else FULL for i in range(out["num_hidden_layers"])]
    rope = out.get("rope_parameters")
    if not (isinstance(rope, dict) and (FULL in rope or SLIDING in rope)):
        full = {"rope_type": "default", **(out.get("rope_scaling") or {})}
        full.setdefault("rope_theta", out.get("rope_theta", _THETA[FULL]))
        local = {"rope_type": "default", "rope_theta": out.get("rope_local_base_freq", _THETA[SLIDING])}
        rope = {FULL: full, SLIDING: local}
    out["rope_parameters"] = {
        kind: {"rope_type": "default", "rope_theta": _THETA[kind], **(rope.get(kind) or {})}
        for kind in (FULL, SLIDING)
    }
    return out


def gemma3_windows(config: ModelConfig) -> Windows:
    """`layer_types`, with `sliding_window` on the sliding layers."""
    return windows_from_layer_types(config, config.hf["layer_types"], config.hf.get("sliding_window"))


class GemmaDecoderLayer(nn.Module):
    """Sandwich norms: x + post_attn(attn(in(x))), then + post_ff(mlp(pre_ff(.))), every norm (1 + weight).
    Returns (mlp branch, residual) like Llama's layer, for the next layer's first norm to add."""

    def __init__(self, config: ModelConfig, self_attn: nn.Module, mlp: nn.Module):
        super().__init__()
        h, eps, dtype = config.hidden_size, config.rms_norm_eps, config.dtype
        norm = lambda: RMSNorm(h, eps, dtype=dtype, offset=1.0)  # noqa: E731
        self.input_layernorm, self.post_attention_layernorm = norm(), norm()
        self.pre_feedforward_layernorm, self.post_feedforward_layernorm = norm(), norm()
        self.self_attn, self.mlp = self_attn, mlp

    def forward(self, positions, hidden, residual):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.post_attention_layernorm(self.self_attn(positions, hidden))
        hidden, residual = self.pre_feedforward_layernorm(hidden, residual)
        return self.post_feedforward_layernorm(self.mlp(hidden)), residual


class Gemma3ForCausalLM(LlamaForCausalLM):
    attention_windows = staticmethod(gemma3_windows)
    norm_offset = 1.0
    decoder_layer = GemmaDecoderLayer

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        hf = config.hf
        for field, unsupported in (
            ("attn_logit_softcapping", hf.get("attn_logit_softcapping") is not None),
            ("use_bidirectional_attention", bool(hf.get("use_bidirectional_attention"))),
            ("hidden_activation", hf.get("hidden_activation") not in _ACTIVATIONS),
        ):
            if unsupported:
                raise ConfigError(
                    f"{config.architecture} sets {field}={hf.get(field)!r}: ATOM's Gemma 3 computes causal "
                    f"attention without logit soft-capping and a {_ACTIVATIONS[0]} MLP"
                )
        self.ropes = {
            kind: RopeConfig.from_hf({"rope_parameters": hf["rope_parameters"][kind]})
            for kind in (FULL, SLIDING)
        }
        super().__init__(config, ctx, prefix)
        # sqrt(hidden) in the model's dtype, as transformers multiplies by it
        self.embed_scale = float(torch.tensor(math.sqrt(config.hidden_size), dtype=config.dtype))
        self.final_softcap = hf.get("final_logit_softcapping")

    def make_attention(
        self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str
    ) -> nn.Module:
        window = self.attention_windows(config)[layer_index]
        return SelfAttention(
            config,
            ctx,
            layer_index=layer_index,
            prefix=prefix,
            qk_norm=True,
            norm_offset=1.0,
            qkv_bias=config.attention_bias,
            o_bias=config.attention_bias,
            sliding_window=window,
            rope=self.ropes[FULL if window is None else SLIDING],
            softmax_scale=float(config.hf["query_pre_attn_scalar"]) ** -0.5,
        )

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        return GatedMLP(
            config.hidden_size,
            config.intermediate_size,
            bias=False,
            dtype=config.dtype,
            parallel=ctx.parallel,
            prefix=prefix,
            quant_config=ctx.quant_config,
            activation="gelu_tanh",
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids) * self.embed_scale

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().compute_logits(hidden)
        if self.final_softcap is None:
            return logits
        return torch.tanh(logits / self.final_softcap) * self.final_softcap


class Gemma3ForConditionalGeneration(TextOnly, Gemma3ForCausalLM):
    vision_prefixes = ("model.vision_tower.", "model.multi_modal_projector.")
