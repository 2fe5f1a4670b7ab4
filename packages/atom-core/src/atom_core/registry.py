"""Which architectures ATOM implements, and what each needs: declared as data, one ModelSpec per architecture."""

from __future__ import annotations

import importlib
from collections.abc import Collection
from dataclasses import dataclass

from atom_core.config import ModelConfig


class UnsupportedArchitecture(ValueError):
    pass


MHA_FAMILY = frozenset({"mha", "sliding"})
MLA = frozenset({"mla"})
HYBRID = frozenset({"gdn", "mha"})  # linear attention (state slots) beside full attention
QWEN_MTP = "atom_core.models.qwen3_next_mtp"


@dataclass(frozen=True, slots=True)
class ModelSpec:
    architecture: str  # the name in config.json's "architectures"
    model_class: str  # "module:Class", imported only when built
    layer_kinds: frozenset[str]  # every kind its layers can be (mha, sliding, mla, gdn), whatever the config
    draft_class: str | None = None  # "module:Class" of the draft its checkpoint's MTP layers make, if any
    # "module:function" giving config.json with the family's transformers defaults where it is silent
    config_defaults: str | None = None

    def load_class(self) -> type:
        return _import(self.model_class)

    def load_draft_class(self) -> type | None:
        return None if self.draft_class is None else _import(self.draft_class)

    def with_defaults(self, hf: dict) -> dict:
        """config.json as transformers reads it for this family (its defaults filled in)."""
        return hf if self.config_defaults is None else _import(self.config_defaults)(hf)

    def attention_kinds(self, config: ModelConfig) -> tuple[str, ...]:
        """Each layer's kind (mha, sliding, mla, gdn) for this config, as the model class derives it: what
        an attention backend must be able to build, and what each layer's cache spec says it is."""
        kinds = tuple(self.load_class().layer_kinds(config))
        assert set(kinds) <= self.layer_kinds, (
            f"{self.architecture} built {set(kinds)}, declares {self.layer_kinds}"
        )
        return kinds

    def packed_modules_mapping(self) -> dict[str, list[str]]:
        """Packed parameter -> checkpoint modules packed into it, e.g. {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}."""
        mapping: dict[str, list[str]] = {}
        for rule in self.load_class().packed_rules:
            mapping.setdefault(rule.target.strip("."), []).append(rule.source.strip("."))
        return mapping


def _import(path: str) -> type:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


SPECS: dict[str, ModelSpec] = {
    spec.architecture: spec
    for spec in (
        ModelSpec("LlamaForCausalLM", "atom_core.models.llama:LlamaForCausalLM", MHA_FAMILY),
        ModelSpec("Qwen3ForCausalLM", "atom_core.models.qwen3:Qwen3ForCausalLM", MHA_FAMILY),
        ModelSpec("Qwen3MoeForCausalLM", "atom_core.models.qwen3_moe:Qwen3MoeForCausalLM", MHA_FAMILY),
        ModelSpec("Qwen2MoeForCausalLM", "atom_core.models.qwen2_moe:Qwen2MoeForCausalLM", MHA_FAMILY),
        ModelSpec(
            "MixtralForCausalLM",
            "atom_core.models.mixtral:MixtralForCausalLM",
            MHA_FAMILY,
            config_defaults="atom_core.models.mixtral:hf_defaults",
        ),
        ModelSpec(
            "Qwen3NextForCausalLM",
            "atom_core.models.qwen3_next:Qwen3NextForCausalLM",
            HYBRID,
            draft_class=f"{QWEN_MTP}:Qwen3NextMTP",
        ),
        ModelSpec(
            "Qwen3_5ForCausalLM",
            "atom_core.models.qwen3_5:Qwen3_5ForCausalLM",
            HYBRID,
            draft_class=f"{QWEN_MTP}:Qwen3_5MTP",
        ),
        ModelSpec(
            "Qwen3_5MoeForCausalLM",
            "atom_core.models.qwen3_5:Qwen3_5MoeForCausalLM",
            HYBRID,
            draft_class=f"{QWEN_MTP}:Qwen3_5MoeMTP",
        ),
        ModelSpec(
            "Qwen3_5ForConditionalGeneration",
            "atom_core.models.qwen3_5:Qwen3_5ForConditionalGeneration",
            HYBRID,
            draft_class=f"{QWEN_MTP}:Qwen3_5MTP",
        ),
        ModelSpec(
            "Qwen3_5MoeForConditionalGeneration",
            "atom_core.models.qwen3_5:Qwen3_5MoeForConditionalGeneration",
            HYBRID,
            draft_class=f"{QWEN_MTP}:Qwen3_5MoeMTP",
        ),
        ModelSpec(
            "GptOssForCausalLM",
            "atom_core.models.gpt_oss:GptOssForCausalLM",
            MHA_FAMILY,
            config_defaults="atom_core.models.gpt_oss:hf_defaults",
        ),
        ModelSpec(
            "Gemma3ForCausalLM",
            "atom_core.models.gemma3:Gemma3ForCausalLM",
            MHA_FAMILY,
            config_defaults="atom_core.models.gemma3:hf_defaults",
        ),
        ModelSpec(
            "Gemma3ForConditionalGeneration",
            "atom_core.models.gemma3:Gemma3ForConditionalGeneration",
            MHA_FAMILY,
            config_defaults="atom_core.models.gemma3:hf_defaults",
        ),
        ModelSpec(
            "Glm4MoeForCausalLM",
            "atom_core.models.glm4_moe:Glm4MoeForCausalLM",
            MHA_FAMILY,
            draft_class="atom_core.models.glm4_moe:Glm4MoeMTP",
            config_defaults="atom_core.models.glm4_moe:hf_defaults",
        ),
        ModelSpec("DeepseekV2ForCausalLM", "atom_core.models.deepseek_v2:DeepseekV2ForCausalLM", MLA),
        ModelSpec(
            "DeepseekV3ForCausalLM",
            "atom_core.models.deepseek_v2:DeepseekV3ForCausalLM",
            MLA,
            draft_class="atom_core.models.deepseek_mtp:DeepseekMTP",
        ),
    )
}


def supported_architectures(layer_kinds: Collection[str] | None = None) -> tuple[str, ...]:
    """Every architecture ATOM builds; with layer_kinds (what an adapter's attention backend builds), only
    those whose layers are all of those kinds: an engine keeps its own model for the others."""
    if layer_kinds is None:
        return tuple(SPECS)
    return tuple(arch for arch, spec in SPECS.items() if spec.layer_kinds <= set(layer_kinds))


def get_model_spec(architecture: str) -> ModelSpec:
    try:
        return SPECS[architecture]
    except KeyError:
        raise UnsupportedArchitecture(
            f"architecture {architecture!r} is not supported by ATOM; supported: {', '.join(SPECS)}"
        ) from None
