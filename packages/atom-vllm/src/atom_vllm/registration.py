"""What the plugin registers with vLLM: ATOM's model class for each architecture in atom-core's registry,
and the attention backend "ATOM". Both are "module:Class" strings, so nothing heavy is imported here."""

from __future__ import annotations

from atom_core.integration import supported_architectures

MODEL_CLASS = "atom_vllm.model:AtomForCausalLM"
# The layer kinds the adapter's attention builds under vLLM; architectures with others (DeepSeek's MLA,
# for now) stay vLLM's own models.
LAYER_KINDS = frozenset({"mha", "sliding"})
ATTENTION_BACKEND = "atom_vllm.attention.backend.AtomAttentionBackend"


def register_models() -> tuple[str, ...]:
    """Point vLLM's model registry at ATOM for every architecture atom-core implements with LAYER_KINDS."""
    from vllm import ModelRegistry

    architectures = supported_architectures(layer_kinds=LAYER_KINDS)
    for arch in architectures:
        ModelRegistry.register_model(arch, MODEL_CLASS)
    return architectures


def register_attention_backend() -> None:
    """Add "ATOM" to vLLM's attention backends (selectable by name; ATOM's models always use it)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if "ATOM" not in AttentionBackendEnum.__members__:
        AttentionBackendEnum.register("ATOM", ATTENTION_BACKEND)
