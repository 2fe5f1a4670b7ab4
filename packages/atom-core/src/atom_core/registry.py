"""Which architectures ATOM implements, and what each needs: declared as data, one ModelSpec per architecture."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from atom_core.config import ModelConfig


class UnsupportedArchitecture(ValueError):
    pass


@dataclass(frozen=True, slots=True)
class ModelSpec:
    architecture: str  # the name in config.json's "architectures"
    model_class: str  # "module:Class", imported only when built

    def load_class(self) -> type:
        module, _, name = self.model_class.partition(":")
        return getattr(importlib.import_module(module), name)

    def attention_kinds(self, config: ModelConfig) -> tuple[str, ...]:
        """Each layer's kind (mha, sliding, mla, gdn) for this config, as the model class derives it: what
        an attention backend must be able to build, and what each layer's cache spec says it is."""
        return tuple(self.load_class().layer_kinds(config))

    def packed_modules_mapping(self) -> dict[str, list[str]]:
        """Packed parameter -> checkpoint modules packed into it, e.g. {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}."""
        mapping: dict[str, list[str]] = {}
        for rule in self.load_class().packed_rules:
            mapping.setdefault(rule.target.strip("."), []).append(rule.source.strip("."))
        return mapping


SPECS: dict[str, ModelSpec] = {
    spec.architecture: spec
    for spec in (
        ModelSpec("LlamaForCausalLM", "atom_core.models.llama:LlamaForCausalLM"),
        ModelSpec("Qwen3ForCausalLM", "atom_core.models.qwen3:Qwen3ForCausalLM"),
        ModelSpec("Qwen3MoeForCausalLM", "atom_core.models.qwen3_moe:Qwen3MoeForCausalLM"),
        ModelSpec("Qwen2MoeForCausalLM", "atom_core.models.qwen2_moe:Qwen2MoeForCausalLM"),
    )
}


def supported_architectures() -> tuple[str, ...]:
    return tuple(SPECS)


def get_model_spec(architecture: str) -> ModelSpec:
    try:
        return SPECS[architecture]
    except KeyError:
        raise UnsupportedArchitecture(
            f"architecture {architecture!r} is not supported by ATOM; supported: {', '.join(SPECS)}"
        ) from None
