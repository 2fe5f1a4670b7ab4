"""The multi-head latent attention frontend (DeepSeek-V2/V3): low-rank projections, rotary on the rope part,
and the absorption of kv_b_proj, so the backend attends over one cached latent row per token.

Per head, the un-absorbed attention is softmax(q_nope.k_nope + q_pe.k_pe) @ v with k_nope = W_UK @ c and
v = W_UV @ c for the token's latent c (kv_b_proj holds W_UK and W_UV, per head). Absorbed: the query becomes
[W_UK^T q_nope | q_pe] against the cached [c | k_pe], and the output W_UV @ (attention-weighted c).
A backend may ask for the un-absorbed form instead (long fresh prefills, attention/mla.py).
"""

from __future__ import annotations

import torch
from torch import nn

from atom_core.attention.mla import MLALayerSpec
from atom_core.build import BuildContext
from atom_core.config import ModelConfig
from atom_core.layers.joint_linear import JointLinears
from atom_core.layers.linear import ColumnParallelLinear, ReplicatedLinear, RowParallelLinear
from atom_core.layers.norm import RMSNorm
from atom_core.layers.parallel import RankPartial
from atom_core.layers.rotary import RotaryEmbedding, yarn_mscale
from atom_core.ops import MAX_ABSORB_TOKENS, absorb_output, absorb_query


def mla_softmax_scale(config: ModelConfig, qk_head_dim: int) -> float:
    """qk_head_dim ** -0.5, times mscale(factor, mscale_all_dim) ** 2 for scaled rope (as transformers)."""
    scale = qk_head_dim**-0.5
    rope = config.rope
    if rope.rope_type != "default" and rope.mscale_all_dim:
        scale *= yarn_mscale(rope.factor, rope.mscale_all_dim) ** 2
    return scale


class MLAAttention(nn.Module):
    def __init__(
        self, config: ModelConfig, ctx: BuildContext, *, layer_index: int, prefix: str, interleaved: bool
    ):
        super().__init__()
        hf = config.hf
        self.q_lora_rank = hf.get("q_lora_rank")
        self.kv_lora_rank, self.rope_dim = hf["kv_lora_rank"], hf["qk_rope_head_dim"]
        self.nope_dim, self.v_dim = hf["qk_nope_head_dim"], hf["v_head_dim"]
        qk_head_dim = self.nope_dim + self.rope_dim
        heads, hidden, bias = config.num_attention_heads, config.hidden_size, config.attention_bias
        common = dict(dtype=config.dtype, parallel=ctx.parallel, quant_config=ctx.quant_config)
        if self.q_lora_rank is None:
            self.q_proj = ColumnParallelLinear(
                hidden, heads * qk_head_dim, bias=False, prefix=f"{prefix}.q_proj", **common
            )
        else:
            self.q_a_proj = ReplicatedLinear(
                hidden, self.q_lora_rank, bias=bias, prefix=f"{prefix}.q_a_proj", **common
            )
            self.q_a_layernorm = RMSNorm(self.q_lora_rank, config.rms_norm_eps, dtype=config.dtype)
            self.q_b_proj = ColumnParallelLinear(
                self.q_lora_rank, heads * qk_head_dim, bias=False, prefix=f"{prefix}.q_b_proj", **common
            )
        self.kv_a_proj_with_mqa = ReplicatedLinear(
            hidden,
            self.kv_lora_rank + self.rope_dim,
            bias=bias,
            prefix=f"{prefix}.kv_a_proj_with_mqa",
            **common,
        )
        # the query's (first) and the latent's projections of the input as one matmul once loaded
        self.in_projs = JointLinears(
            self.q_proj if self.q_lora_rank is None else self.q_a_proj, self.kv_a_proj_with_mqa
        )
        self.kv_a_layernorm = RMSNorm(self.kv_lora_rank, config.rms_norm_eps, dtype=config.dtype)
        self.kv_b_proj = ColumnParallelLinear(
            self.kv_lora_rank,
            heads * (self.nope_dim + self.v_dim),
            bias=False,
            prefix=f"{prefix}.kv_b_proj",
            **common,
        )
        self.kv_b_proj.keep_dense_weight = (
            True  # the absorbed path multiplies by its matrix (fp8: dequantized)
        )
        self.o_proj = RowParallelLinear(
            heads * self.v_dim, hidden, bias=bias, prefix=f"{prefix}.o_proj", **common
        )
        self.num_heads = heads // ctx.parallel.tp_size  # the column-parallel projections checked divisibility
        self.rotary_emb = RotaryEmbedding(
            self.rope_dim, config.rope, config.max_position_embeddings, neox=not interleaved
        )
        spec = MLALayerSpec(
            layer_index=layer_index,
            num_heads=self.num_heads,
            kv_lora_rank=self.kv_lora_rank,
            rope_dim=self.rope_dim,
            scale=mla_softmax_scale(config, qk_head_dim),
            prefix=f"{prefix}.attn",
        )
        self.cache_index, self.cache_spec = layer_index, spec.cache_spec()
        self.attn = ctx.attention_backend.make_mla_layer(spec)

    def defer_output_reduce(self) -> None:
        """forward returns o_proj's partial sum for the next RMSNorm to reduce (tensor parallel)."""
        self.o_proj.defer_reduce = True

    def forward(self, positions: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor | RankPartial:
        tokens, heads = hidden.shape[0], self.num_heads
        q, latent = self.in_projs(hidden)
        if self.q_lora_rank is not None:
            q = self.q_b_proj(self.q_a_layernorm(q))
        q = q.view(tokens, heads, self.nope_dim + self.rope_dim)
        q_nope, q_pe = q.split([self.nope_dim, self.rope_dim], dim=-1)  # [T, H, nope], [T, H, P]
        kv_c, k_pe = latent.split([self.kv_lora_rank, self.rope_dim], dim=-1)
        kv_c = self.kv_a_layernorm(kv_c)  # [T, R] (the norm reads strided rows: no copy first)
        k_pe = k_pe.contiguous().view(tokens, 1, self.rope_dim)
        q_pe, k_pe = self.rotary_emb(positions, q_pe, k_pe)
        if self.attn.wants_unabsorbed():  # long fresh prefills: per-head K and V from the latent, once
            k_nope, v = self.kv_b_proj(kv_c).view(tokens, heads, -1).split([self.nope_dim, self.v_dim], -1)
            k = torch.cat([k_nope, k_pe.expand(tokens, heads, self.rope_dim)], dim=-1)
            out = self.attn.unabsorbed(
                torch.cat([q_nope, q_pe], dim=-1), k, v, kv_c, k_pe.view(tokens, self.rope_dim)
            )  # [T, H, v]
            return self.o_proj(out.reshape(tokens, heads * self.v_dim))
        w = self.kv_b_proj.quant_method.dense(self.kv_b_proj)
        w = w.view(heads, self.nope_dim + self.v_dim, self.kv_lora_rank)
        w_uk, w_uv = w[:, : self.nope_dim], w[:, self.nope_dim :]  # [H, nope, R], [H, v, R]
        if tokens <= MAX_ABSORB_TOKENS:  # decode: weight reads, in the kernels' PDL chain, no concatenation
            out = self.attn(absorb_query(q_nope, q_pe, w_uk), kv_c, k_pe.view(tokens, self.rope_dim))
            out = absorb_output(out, w_uv)  # [T, H, v]
            return self.o_proj(out.reshape(tokens, heads * self.v_dim))
        q_latent = torch.bmm(q_nope.transpose(0, 1), w_uk).transpose(0, 1)  # [T, H, R]
        out = self.attn(
            torch.cat([q_latent, q_pe], dim=-1), kv_c, k_pe.view(tokens, self.rope_dim)
        )  # [T, H, R]
        out = torch.bmm(out.transpose(0, 1), w_uv.transpose(1, 2)).transpose(0, 1)  # [T, H, v]
        return self.o_proj(out.reshape(tokens, heads * self.v_dim))
