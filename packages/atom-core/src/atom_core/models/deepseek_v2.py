"""DeepSeek-V2 and V3: multi-head latent attention (layers/mla.py) and DeepSeek's MoE (routed experts with
grouped top-k routing, plus always-on shared experts) after the first_k_dense_replace dense layers.

V2 routes by softmax, greedy or group-limited (a group scores its best expert), never renormalising (as
transformers' V2 router, whatever norm_topk_prob says); V3 by sigmoid plus e_score_correction_bias, a group
scoring its two best experts, renormalising with norm_topk_prob. Both scale by routed_scaling_factor. The
MTP layers a V3 checkpoint carries after its decoder layers are the draft model's, not loaded here.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

import torch
from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig
from atom_core.layers.mla import MLAAttention
from atom_core.layers.mlp import GatedMLP
from atom_core.layers.moe import SparseMoE
from atom_core.layers.parallel import RankPartial, add_sums
from atom_core.models.llama import LlamaForCausalLM
from atom_core.models.qwen3_moe import expert_rule
from atom_core.models.weights import GATE_UP_PACKED, load_by_rules
from atom_core.ops import SharedExpert, grouped_topk, linear

_LAYER = re.compile(r"^model\.layers\.(\d+)\.")


class DeepseekMoE(SparseMoE):
    """Routed experts (stacked, split over ranks like SparseMoE's) chosen by grouped top-k, plus shared experts."""

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str, *, routing: dict):
        hf = config.hf
        super().__init__(
            config.hidden_size,
            hf["moe_intermediate_size"],
            hf["n_routed_experts"],
            hf["num_experts_per_tok"],
            norm_topk_prob=routing["renormalize"],
            dtype=config.dtype,
            parallel=ctx.parallel,
            prefix=prefix,
            quant_config=ctx.quant_config,
        )
        self.routing = routing
        if routing["scoring"] == "sigmoid":  # kept in fp32, as transformers keeps it
            self.gate.e_score_correction_bias = nn.Parameter(
                torch.zeros(self.num_experts, dtype=torch.float32), requires_grad=False
            )
        self.shared_experts = None
        if hf.get("n_shared_experts"):
            self.shared_experts = GatedMLP(
                config.hidden_size,
                hf["moe_intermediate_size"] * hf["n_shared_experts"],
                bias=bool(hf.get("mlp_bias", False)),
                dtype=config.dtype,
                parallel=ctx.parallel,
                prefix=f"{prefix}.shared_experts",
                quant_config=ctx.quant_config,
            )

    def shared_mlp(self) -> GatedMLP | None:
        return self.shared_experts

    def route(self, x: torch.Tensor):
        """x: [T, H] -> (weights [T, k] fp32, ids [T, k]); router logits in fp32, as transformers computes them
        (from fp32 copies of x and the weight: here one matmul that keeps its fp32 sums, no copies)."""
        logits = linear(x, self.gate.weight, out_dtype=torch.float32)
        r = self.routing
        return grouped_topk(
            logits,
            self.top_k,
            num_groups=r["num_groups"],
            topk_groups=r["topk_groups"],
            bias=getattr(self.gate, "e_score_correction_bias", None),
            scoring=r["scoring"],
            renormalize=r["renormalize"],
            scaling=r["scaling"],
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor | RankPartial:
        weights, ids = self.route(x)
        if self.shared_experts is not None and self.parallel.tp_size == 1:
            # the shared experts' output joins the routed experts' combine (no sum after it)
            return self.experts(x, weights, ids, SharedExpert(self.shared_experts(x)))
        out = self.experts(x, weights, ids)
        if self.shared_experts is not None:
            out = add_sums(out, self.shared_experts(x))
        return out


class DeepseekV2ForCausalLM(LlamaForCausalLM):
    packed_rules = GATE_UP_PACKED  # MLA's projections are separate modules, as in the checkpoint
    name_rules = (expert_rule,)

    def __init__(self, config: ModelConfig, ctx: BuildContext, prefix: str = ""):
        hf = config.hf
        if (freq := hf.get("moe_layer_freq", 1)) != 1:
            raise ConfigError(
                f"{config.architecture} sets moe_layer_freq={freq!r}: transformers ignores it (MoE on every layer "
                "from first_k_dense_replace on), so ATOM refuses to pick one; only 1 is supported"
            )
        self.routing = self.routing_for(config)
        super().__init__(config, ctx, prefix)

    @classmethod
    def layer_kinds(cls, config: ModelConfig) -> tuple[str, ...]:
        return ("mla",) * config.num_hidden_layers

    @staticmethod
    def routing_for(config: ModelConfig) -> dict:
        hf = config.hf
        method = hf.get("topk_method", "greedy")
        if method == "greedy":
            groups, kept = 1, 1
        elif method == "group_limited_greedy":
            groups, kept = hf["n_group"], hf["topk_group"]
        else:
            raise ConfigError(
                f"{config.architecture}: topk_method {method!r} is not supported "
                "(supported: greedy, group_limited_greedy)"
            )
        scaling = float(hf.get("routed_scaling_factor", 1.0))
        return dict(
            num_groups=groups, topk_groups=kept, scoring="softmax", renormalize=False, scaling=scaling
        )

    @classmethod
    def rope_interleaved(cls, config: ModelConfig) -> bool:
        return True  # V2 always rotates adjacent pairs (transformers' complex form)

    def make_attention(
        self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str
    ) -> nn.Module:
        return self.make_mla(config, ctx, layer_index, prefix)

    @classmethod
    def make_mla(cls, config: ModelConfig, ctx: BuildContext, cache_index: int, prefix: str) -> MLAAttention:
        """The MLA frontend of a layer (the draft's MTP layer builds its own with this too)."""
        return MLAAttention(
            config, ctx, layer_index=cache_index, prefix=prefix, interleaved=cls.rope_interleaved(config)
        )

    @classmethod
    def make_mtp_attention(
        cls, config: ModelConfig, ctx: BuildContext, cache_index: int, prefix: str
    ) -> nn.Module:
        """The attention of the draft's MTP layer (the target's kind, in the draft's own cache)."""
        return cls.make_mla(config, ctx, cache_index, prefix)

    def make_mlp(self, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str) -> nn.Module:
        return self.make_deepseek_mlp(config, ctx, layer_index, prefix)

    @classmethod
    def make_deepseek_mlp(
        cls, config: ModelConfig, ctx: BuildContext, layer_index: int, prefix: str
    ) -> nn.Module:
        """MoE from first_k_dense_replace on, a dense gated MLP before (the MTP layer's index counts too)."""
        hf = config.hf
        if hf.get("n_routed_experts") and layer_index >= hf.get("first_k_dense_replace", 0):
            return DeepseekMoE(config, ctx, prefix, routing=cls.routing_for(config))
        return GatedMLP(
            config.hidden_size,
            config.intermediate_size,
            bias=bool(hf.get("mlp_bias", False)),
            dtype=config.dtype,
            parallel=ctx.parallel,
            prefix=prefix,
            quant_config=ctx.quant_config,
        )

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        layers = self.config.num_hidden_layers
        tied = self.config.tie_word_embeddings

        def skip(name: str) -> bool:
            if "rotary_emb.inv_freq" in name or (tied and name == "lm_head.weight"):
                return True
            m = _LAYER.match(name)
            return m is not None and int(m.group(1)) >= layers  # the MTP draft's layers

        return load_by_rules(self, weights, self.packed_rules, name_rules=self.name_rules, skip=skip)


class DeepseekV3ForCausalLM(DeepseekV2ForCausalLM):
    @classmethod
    def rope_interleaved(
        cls, config: ModelConfig
    ) -> bool:  # published V3 configs omit it: True in transformers
        return bool(config.hf.get("rope_interleave", True))

    @staticmethod
    def routing_for(config: ModelConfig) -> dict:
        hf = config.hf
        method, scoring = hf.get("topk_method", "noaux_tc"), hf.get("scoring_func", "sigmoid")
        if method != "noaux_tc" or scoring != "sigmoid":
            raise ConfigError(
                f"{config.architecture}: topk_method {method!r} with scoring_func {scoring!r} is not supported "
                "(transformers' DeepSeek-V3 computes noaux_tc with sigmoid)"
            )
        return dict(
            num_groups=hf.get("n_group") or 1,
            topk_groups=hf.get("topk_group") or 1,
            scoring="sigmoid",
            renormalize=bool(hf.get("norm_topk_prob", True)),
            scaling=float(hf.get("routed_scaling_factor", 1.0)),
        )
