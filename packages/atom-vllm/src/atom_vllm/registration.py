"""What the plugin registers with vLLM: ATOM's model class for each architecture in atom-core's registry,
ATOM's MTP draft for vLLM's draft architectures, and the backends "ATOM", "ATOM_MLA" and "ATOM_GDN". All
are "module:Class" strings, so nothing heavy is imported here."""

from __future__ import annotations

from atom_core.integration import LAYER_KINDS, get_model_spec, supported_architectures

MODEL_CLASS = "atom_vllm.model:AtomForCausalLM"
HYBRID_MODEL_CLASS = "atom_vllm.hybrid:AtomHybridForCausalLM"  # models with Gated DeltaNet layers
DRAFT_CLASS = "atom_vllm.draft:AtomMTPDraft"
# vLLM's MTP draft architecture (what its speculative config writes into the draft's config) -> the target
# whose MTP layers it is built from (Qwen3.5's ConditionalGeneration checkpoints draft as the text model)
DRAFTS = {
    "DeepSeekMTPModel": "DeepseekV3ForCausalLM",
    "Glm4MoeMTPModel": "Glm4MoeForCausalLM",
    "Qwen3NextMTP": "Qwen3NextForCausalLM",
    "Qwen3_5MTP": "Qwen3_5ForCausalLM",
    "Qwen3_5MoeMTP": "Qwen3_5MoeForCausalLM",
}
# The adapter builds every layer kind atom-core has (LAYER_KINDS); an architecture with another would stay
# vLLM's own model.
ATTENTION_BACKEND = "atom_vllm.attention.backend.AtomAttentionBackend"
MLA_BACKEND = "atom_vllm.attention.mla.AtomMLABackend"
GDN_BACKEND = "atom_vllm.attention.gdn_backend.AtomGDNBackend"


def register_models() -> tuple[str, ...]:
    """Point vLLM's model registry at ATOM for every architecture atom-core implements with LAYER_KINDS, and
    at ATOM's MTP draft for the draft architectures of those targets. Returns the names registered."""
    from vllm import ModelRegistry

    architectures = supported_architectures(layer_kinds=LAYER_KINDS)
    for arch in architectures:
        hybrid = "gdn" in get_model_spec(arch).layer_kinds
        ModelRegistry.register_model(arch, HYBRID_MODEL_CLASS if hybrid else MODEL_CLASS)
    # (a target's draft exists where atom-core's registry names its draft class)
    drafts = tuple(
        draft
        for draft, target in DRAFTS.items()
        if target in architectures and get_model_spec(target).draft_class is not None
    )
    for draft in drafts:
        ModelRegistry.register_model(draft, DRAFT_CLASS)
    return architectures + drafts


def register_attention_backend() -> None:
    """Add "ATOM" and "ATOM_MLA" to vLLM's attention backends and "ATOM_GDN" to its mamba backends (by name;
    ATOM's models always use them)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, MambaAttentionBackendEnum

    for enum, name, path in (
        (AttentionBackendEnum, "ATOM", ATTENTION_BACKEND),
        (AttentionBackendEnum, "ATOM_MLA", MLA_BACKEND),
        (MambaAttentionBackendEnum, "ATOM_GDN", GDN_BACKEND),
    ):
        if name not in enum.__members__:
            enum.register(name, path)
