"""What each architecture needs on the SGLang side, declared as data beside atom-core's ModelSpec.

The wrapper in model.py has no per-model branches: it asks `adapter_spec(architecture)` how to prepare the
config, which checkpoint tensors are the model's, how attention layers map to SGLang's KV-pool layers and
what to install on the built wrapper. Every architecture in atom-core's registry gets the defaults; an
entry in OVERRIDES changes only what differs. Drafts are the names SGLang gives a target's MTP layer when it
builds the speculative draft (DRAFTS): their spec is the target's, with role "draft". A draft's attention
is layer 0 of the draft runner's own KV pool (SGLang sizes it num_nextn_predict_layers, from layer 0),
which is the cache index atom-core's drafts use, so the default layer ids hold for them too.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace

from atom_core.integration import LAYER_KINDS, ModelSpec, get_model_spec, supported_architectures


def _same(hf_config: dict) -> dict:
    return hf_config


def _nothing(wrapper) -> None:
    return None


@dataclass(frozen=True, slots=True)
class SglangModelSpec:
    architecture: str  # the name SGLang resolves (the wrapper class is named after it)
    core: ModelSpec  # atom-core's declaration: the model class and its layer kinds
    role: str = "target"  # "target", or "draft" for MTP/NextN heads run by SGLang's speculative worker
    # a draft's possible target architectures (atom-core builds the MTP draft of the one the checkpoint's
    # config.json names; SGLang's draft name alone does not tell Qwen3.5's four apart)
    draft_of: tuple[str, ...] = ()
    prepare_config: Callable[[dict], dict] = _same  # SGLang's HF config dict -> what atom-core builds from
    checkpoint_prefix: str = ""  # only tensors under it are the model's, with it stripped
    layer_id: Callable[[int], int] = field(default=lambda index: index)  # attention index -> KV-pool layer
    install: Callable[[object], None] = _nothing  # runs on the built wrapper (expose hooks SGLang reads)


def requires_no_radix_cache(wrapper) -> None:
    """Gated DeltaNet hybrids: SGLang's mamba radix cache snapshots the recurrent state inside its own GDN
    backend, which ATOM's GDN layers do not run, so a prefix hit would start from a state nobody saved."""
    from sglang.srt.runtime_context import get_memory

    if not get_memory().disable_radix_cache:
        raise NotImplementedError(
            f"ATOM's {wrapper.spec.architecture} under SGLang keeps no prefix-cache snapshots of its GDN "
            "states: launch with --disable-radix-cache"
        )


# Gated DeltaNet hybrids, as atom-core's registry declares them
HYBRIDS = tuple(arch for arch in supported_architectures() if "gdn" in get_model_spec(arch).layer_kinds)

# Per-architecture differences from the defaults: {architecture: {field: value}}; keys must name an
# architecture atom-core builds.
OVERRIDES: Mapping[str, Mapping[str, object]] = {
    arch: {"install": requires_no_radix_cache} for arch in HYBRIDS
}


# SGLang's draft architecture names (its ModelConfig renames the target's for the draft runner) -> the
# targets whose MTP layer atom-core builds as the draft.
DRAFTS: Mapping[str, tuple[str, ...]] = {
    "DeepseekV3ForCausalLMNextN": ("DeepseekV3ForCausalLM",),
    "Glm4MoeForCausalLMNextN": ("Glm4MoeForCausalLM",),
    "Qwen3NextForCausalLMMTP": ("Qwen3NextForCausalLM",),
    "Qwen3_5ForCausalLMMTP": (
        "Qwen3_5ForCausalLM",
        "Qwen3_5MoeForCausalLM",
        "Qwen3_5ForConditionalGeneration",
        "Qwen3_5MoeForConditionalGeneration",
    ),
}


def adapter_spec(architecture: str) -> SglangModelSpec:
    """The SGLang-side spec of an architecture atom-core supports, or of a draft named in DRAFTS (raises
    naming the supported ones)."""
    targets = DRAFTS.get(architecture)
    if targets is not None:
        spec = SglangModelSpec(architecture, get_model_spec(targets[0]), role="draft", draft_of=targets)
    else:
        spec = SglangModelSpec(architecture, get_model_spec(architecture))
    return replace(spec, **OVERRIDES.get(architecture, {}))


def served_architectures() -> tuple[str, ...]:
    """Every architecture the external model package exposes to SGLang: targets (all of atom-core's layer
    kinds are built here; an architecture with another would stay SGLang's own model), then drafts."""
    targets = supported_architectures(layer_kinds=LAYER_KINDS)
    # targets whose draft atom-core's registry names
    drafting = {arch for arch in targets if get_model_spec(arch).draft_class is not None}
    return targets + tuple(draft for draft, of in DRAFTS.items() if set(of) <= drafting)
