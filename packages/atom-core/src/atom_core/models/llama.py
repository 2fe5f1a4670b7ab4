"""Llama (and the families that reuse its structure: Qwen3 declares q/k norm, Qwen3-MoE sparse MLPs)."""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ModelConfig
from atom_core.layers.attention import SelfAttention
from atom_core.layers.embedding import ParallelLMHead, VocabParallelEmbedding
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.norm import RMSNorm
from atom_core.layers.parallel import defer_reductions_to_norms
from atom_core.models.attention_windows import llama_windows
from atom_core.models.weights import LLAMA_PACKED, load_by_rules


class DecoderLayer(nn.Module):
    """Pre-norm residual block around the attention and MLP modules its model built for this layer."""

    def __init__(
        self, config: ModelConfig, self_attn: nn.Module, mlp: nn.Module, *, norm_offset: float = 0.0
    ):
        super().__init__()
        eps, dtype = config.rms_norm_eps, config.dtype
        self.input_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, offset=norm_offset)
        self.self_attn = self_attn
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps, dtype=dtype, offset=norm_offset)
        self.mlp = mlp
        defer_reductions_to_norms(self_attn, mlp)  # tensor parallel: each all-reduce fused with its norm

    def forward(self, positions, hidden, residual):
        if residual is None:
            hidden, residual = self.input_layernorm(hidden), hidden
        else:
            hidden, residual = self.input_layernorm(hidden, residual)
        hidden = self.self_attn(positions, hidden)
        hidden, residual = self.post_attention_layernorm(hidden, residual)
        return self.mlp(hidden), residual


class LlamaForCausalLM(nn.Module):
    """forward(input_ids [T], positions [T]) -> hidden [T, H]; compute_logits(hidden) -> [T, vocab]."""

    qk_norm = False  # Qwen3: RMSNorm over each head of q and k before rotary
    attention_windows = staticmethod(llama_windows)  # config -> each layer's window (attention_windows.py)
    packed_rules = LLAMA_PACKED
    name_rules = ()
    norm_offset = 0.0  # 1.0: the model's final norm scales by (1 + weight)
    decoder_layer = DecoderLayer  # (config, self_attn, mlp) -> the layer around them (Gemma: sandwich norms)

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        super().__init__()
        self.config = config
        p = f"{prefix}model"
        dtype, parallel = config.dtype, ctx.parallel
        self.model = nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(
            config.vocab_size, config.hidden_size, dtype=dtype, parallel=parallel
        )
        self.model.layers = nn.ModuleList(
            self.make_layer(config, ctx, i, f"{p}.layers.{i}") for i in range(config.num_hidden_layers)
        )
        self.model.norm = RMSNorm(
            config.hidden_size, config.rms_norm_eps, dtype=dtype, offset=self.norm_offset
        )
        self.lm_head = ParallelLMHead(config.vocab_size, config.hidden_size, dtype=dtype, parallel=parallel)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight

    @classmethod
    def layer_kinds(cls, config: ModelConfig) -> tuple[str, ...]:
        """Full-attention layers are mha, windowed ones sliding (atom_core.registry's kinds)."""
        return tuple("mha" if w is None else "sliding" for w in cls.attention_windows(config))

    def make_layer(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        return self.decoder_layer(
            config,
            self.make_attention(config, ctx, layer_index, f"{prefix}.self_attn"),
            self.make_mlp(config, ctx, layer_index, f"{prefix}.mlp"),
        )

    def make_attention(
        self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str
    ) -> nn.Module:
        window = self.attention_windows(config)[layer_index]
        qkv_bias, o_bias = self.attention_biases(config)
        return SelfAttention(
            config,
            ctx,
            layer_index=layer_index,
            prefix=prefix,
            qk_norm=self.qk_norm,
            qkv_bias=qkv_bias,
            o_bias=o_bias,
            sliding_window=window,
        )

    def attention_biases(self, config: ModelConfig) -> tuple[bool, bool]:
        """(q/k/v bias, o_proj bias): Llama's attention_bias covers both."""
        return config.attention_bias, config.attention_bias

    def mlp_bias(self, config: ModelConfig) -> bool:
        """Llama reads mlp_bias; the Qwen families' MLPs have no biases whatever the config says."""
        return bool(config.hf.get("mlp_bias", False))

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        return GatedMLP(
            config.hidden_size,
            config.intermediate_size,
            bias=self.mlp_bias(config),
            dtype=config.dtype,
            parallel=ctx.parallel,
            prefix=prefix,
            quant_config=ctx.quant_config,
        )

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model.embed_tokens(input_ids)

    def forward(
        self, input_ids: torch.Tensor, positions: torch.Tensor, inputs_embeds: torch.Tensor | None = None
    ):
        hidden = self.embed_input_ids(input_ids) if inputs_embeds is None else inputs_embeds
        residual = None
        for layer in self.model.layers:
            hidden, residual = layer(positions, hidden, residual)
        hidden, _ = self.model.norm(hidden, residual)
        return hidden

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden)

    def skip_weight(self, name: str) -> bool:
        """Checkpoint tensors this model does not load (another module may: an MTP draft's)."""
        return "rotary_emb.inv_freq" in name or (self.config.tie_word_embeddings and name == "lm_head.weight")

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_by_rules(
            self, weights, self.packed_rules, name_rules=self.name_rules, skip=self.skip_weight
        )
