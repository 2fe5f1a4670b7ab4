"""The multi-head (GQA) attention frontend: projections, optional q/k norm, rotary, then the backend."""

from __future__ import annotations

import torch
from torch import nn

from atom_core.attention.backend import AttentionLayerSpec, QKPrologue
from atom_core.build import BuildContext
from atom_core.config import ModelConfig, RopeConfig
from atom_core.layers.fused import sigmoid_gate_linear
from atom_core.layers.linear import QKVParallelLinear, RowParallelLinear
from atom_core.layers.norm import RMSNorm
from atom_core.layers.parallel import RankPartial
from atom_core.layers.rotary import RotaryEmbedding


class SelfAttention(nn.Module):
    def __init__(
        self,
        config: ModelConfig,
        ctx: BuildContext,
        *,
        layer_index: int,
        prefix: str,
        qk_norm: bool = False,
        qkv_bias: bool = False,
        o_bias: bool = False,
        sliding_window: int | None = None,
        output_gate: bool = False,
        norm_offset: float = 0.0,
        sinks: bool = False,
        rope: RopeConfig | None = None,
        softmax_scale: float | None = None,
    ):
        """output_gate: q_proj also gives each head a gate, [q_h | gate_h] per head (Qwen3-Next, Qwen3.5),
        and the output is attention * sigmoid(gate); norm_offset: the q/k norms' (1 + weight) form;
        sinks: a learned sink logit per head joins each softmax (GPT-OSS's `self_attn.sinks` [Hq]);
        rope: this layer's rotary where it is not config.rope (Gemma 3's local and global bases);
        softmax_scale: where it is not head_dim ** -0.5 (Gemma 3's query_pre_attn_scalar ** -0.5)."""
        super().__init__()
        d, dtype = config.head_dim, config.dtype
        common = dict(dtype=dtype, parallel=ctx.parallel, quant_config=ctx.quant_config)
        self.output_gate = output_gate
        self.qkv_proj = QKVParallelLinear(
            config.hidden_size,
            d,
            config.num_attention_heads * (2 if output_gate else 1),  # a gate "head" beside each q head
            config.num_key_value_heads,
            bias=qkv_bias,
            prefix=f"{prefix}.qkv_proj",
            **common,
        )
        self.num_heads, self.num_kv_heads, self.head_dim = (
            self.qkv_proj.num_heads // (2 if output_gate else 1),
            self.qkv_proj.num_kv_heads,
            d,
        )
        self.o_proj = RowParallelLinear(
            config.num_attention_heads * d,
            config.hidden_size,
            bias=o_bias,
            prefix=f"{prefix}.o_proj",
            **common,
        )
        self.q_norm = RMSNorm(d, config.rms_norm_eps, dtype=dtype, offset=norm_offset) if qk_norm else None
        self.k_norm = RMSNorm(d, config.rms_norm_eps, dtype=dtype, offset=norm_offset) if qk_norm else None
        self.rotary_emb = RotaryEmbedding(d, rope or config.rope, config.max_position_embeddings)
        self.sinks = None
        if sinks:  # fp32, as the kernels read it; this rank's heads
            self.sinks = nn.Parameter(torch.empty(self.num_heads, dtype=torch.float32), requires_grad=False)
            self.sinks.weight_loader = self._load_sinks
        spec = AttentionLayerSpec(
            layer_index=layer_index,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            head_dim=d,
            scale=d**-0.5 if softmax_scale is None else softmax_scale,
            prefix=f"{prefix}.attn",
            sliding_window=sliding_window,
            sinks=self.sinks,
        )
        # What this layer keeps cached, for the engine that allocates it (atom_core.cache).
        self.cache_index, self.cache_spec = layer_index, spec.cache_spec()
        self.attn = ctx.attention_backend.make_layer(spec)

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | RankPartial:
        tokens = hidden.shape[0]
        q_width = self.num_heads * self.head_dim * (2 if self.output_gate else 1)
        q, k, v = self.qkv_proj(hidden).split(
            [q_width, self.num_kv_heads * self.head_dim, self.num_kv_heads * self.head_dim], -1
        )
        gate = None
        if self.output_gate:  # q stays a strided view: the norm (or the fused prologue) writes a new tensor
            q, gate = q.view(tokens, self.num_heads, 2 * self.head_dim).chunk(2, dim=-1)  # gate [T, H, D]
        q = q.view(tokens, self.num_heads, self.head_dim)  # [T, Hq, D]
        k = k.view(tokens, self.num_kv_heads, self.head_dim)  # [T, Hkv, D]
        v = v.view(tokens, self.num_kv_heads, self.head_dim)
        out = None
        if (fused := self._prologue()) is not None:  # norms, rotary and the KV write in one kernel
            out = self.attn.attend_with_prologue(q, k, v, fused, positions)
        if out is None:
            out = self._attend(positions, q, k, v)
        out = out.reshape(tokens, self.num_heads * self.head_dim)  # [T, Hq * D]
        if gate is not None:  # scaled by sigmoid(gate) on its way into o_proj (one kernel at decode)
            return sigmoid_gate_linear(self.o_proj, out, gate)
        return self.o_proj(out)

    def _load_sinks(self, param: nn.Parameter, loaded: torch.Tensor) -> None:
        """The checkpoint's [Hq] sink logits: this rank's heads."""
        heads = self.num_heads
        if tuple(loaded.shape) != (heads * self.qkv_proj.parallel.tp_size,):
            raise ValueError(
                f"expected shape ({heads * self.qkv_proj.parallel.tp_size},), got {tuple(loaded.shape)}"
            )
        param.data.copy_(loaded.narrow(0, self.qkv_proj.parallel.tp_rank * heads, heads))

    def defer_output_reduce(self) -> None:
        """forward returns o_proj's partial sum for the next RMSNorm to reduce (tensor parallel)."""
        self.o_proj.defer_reduce = True

    def _prologue(self) -> QKPrologue | None:
        """The q/k norms (if any) and rotary as one prologue, where the backend layer can fuse them."""
        rope = self.rotary_emb
        if not hasattr(self.attn, "attend_with_prologue"):
            return None
        if rope.rope.rope_type == "dynamic" or not rope.neox:  # rates from the batch; GPT-J pairs
            return None
        norm = self.q_norm
        return QKPrologue(
            None if norm is None else norm.weight,
            None if norm is None else self.k_norm.weight,
            0.0 if norm is None else norm.eps,
            0.0 if norm is None else norm.offset,
            rope.inv_freq,
            rope.rotary_dim,
            rope.scaling,
            rope.rope.mrope_section,
            rope.rope.mrope_interleaved,
        )

    def _attend(self, positions, q, k, v) -> torch.Tensor:
        """The unfused prologue (norms, rotary), then the backend layer -> [T, Hq, D]."""
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = self.rotary_emb(positions, q, k)
        if not getattr(self.attn, "accepts_strided_inputs", False):
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return self.attn(q, k, v)
