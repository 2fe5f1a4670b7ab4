"""What the plugin registers with vLLM: ATOM's model class for each architecture in atom-core's registry,
and the attention backend "ATOM". Both are "module:Class" strings, so nothing heavy is imported here."""

from __future__ import annotations

from atom_core.integration import supported_architectures

MODEL_CLASS = "atom_vllm.model:AtomForCausalLM"
DRAFT_CLASS = "atom_vllm.draft:AtomMTPDraft"
# vLLM's MTP draft architecture (what it writes into the draft's config) -> the target it drafts for
DRAFTS = {"DeepSeekMTPModel": "DeepseekV3ForCausalLM"}
# The layer kinds the adapter's attention builds under vLLM; architectures with others (Gated DeltaNet,
# for now) stay vLLM's own models.
LAYER_KINDS = frozenset({"mha", "sliding", "mla"})
ATTENTION_BACKEND = "atom_vllm.attention.backend.AtomAttentionBackend"
MLA_BACKEND = "atom_vllm.attention.mla.AtomMLABackend"


def register_models() -> tuple[str, ...]:
    """Point vLLM's model registry at ATOM for every architecture atom-core implements with LAYER_KINDS, and
    at ATOM's MTP draft for the draft architectures of those targets. Returns the names registered."""
    from vllm import ModelRegistry

    architectures = supported_architectures(layer_kinds=LAYER_KINDS)
    for arch in architectures:
        ModelRegistry.register_model(arch, MODEL_CLASS)
    drafts = tuple(draft for draft, target in DRAFTS.items() if target in architectures)
    for draft in drafts:
        ModelRegistry.register_model(draft, DRAFT_CLASS)
    return architectures + drafts


def register_attention_backend() -> None:
    """Add "ATOM" and "ATOM_MLA" to vLLM's attention backends (by name; ATOM's models always use them)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    for name, path in (("ATOM", ATTENTION_BACKEND), ("ATOM_MLA", MLA_BACKEND)):
        if name not in AttentionBackendEnum.__members__:
            AttentionBackendEnum.register(name, path)
