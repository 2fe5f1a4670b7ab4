"""What each architecture needs on the SGLang side, declared as data beside atom-core's ModelSpec.

The wrapper in model.py has no per-model branches: it asks `adapter_spec(architecture)` how to prepare the
config, which checkpoint tensors are the model's, how attention layers map to SGLang's KV-pool layers and
what to install on the built wrapper. Every architecture in atom-core's registry gets the defaults; an
entry in OVERRIDES changes only what differs (e.g. a later DeepseekV3ForCausalLMNextN draft: role "draft",
its checkpoint prefix, its pool layer id after the target's layers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from atom_core.integration import ModelSpec, get_model_spec, supported_architectures


def _same(hf_config: dict) -> dict:
    return hf_config


def _nothing(wrapper) -> None:
    return None


@dataclass(frozen=True, slots=True)
class SglangModelSpec:
    architecture: str  # the name SGLang resolves (the wrapper class is named after it)
    core: ModelSpec  # atom-core's declaration: the model class and its layer kinds
    role: str = "target"  # "target", or "draft" for MTP/NextN heads run by SGLang's speculative worker
    prepare_config: Callable[[dict], dict] = _same  # SGLang's HF config dict -> what atom-core builds from
    checkpoint_prefix: str = ""  # only tensors under it are the model's, with it stripped
    layer_id: Callable[[int], int] = field(default=lambda index: index)  # attention index -> KV-pool layer
    install: Callable[[object], None] = _nothing  # runs on the built wrapper (expose hooks SGLang reads)


# Per-architecture differences from the defaults: {architecture: {field: value}}. Empty until a model
# needs one; keys must name an architecture atom-core builds.
OVERRIDES: Mapping[str, Mapping[str, object]] = {}


def adapter_spec(architecture: str) -> SglangModelSpec:
    """The SGLang-side spec of an architecture atom-core supports (raises naming the supported ones)."""
    spec = SglangModelSpec(architecture, get_model_spec(architecture))
    return replace(spec, **OVERRIDES.get(architecture, {}))


# The layer kinds ATOM's wrapper builds under SGLang; architectures with others (DeepSeek's MLA, for now)
# stay SGLang's own models.
LAYER_KINDS = frozenset({"mha", "sliding"})


def served_architectures() -> tuple[str, ...]:
    """Every architecture the external model package exposes to SGLang."""
    return supported_architectures(layer_kinds=LAYER_KINDS)
