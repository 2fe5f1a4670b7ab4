"""What the plugin registers with SGLang: the attention backend "atom", selectable with
`--attention-backend atom` (also for the prefill/decode-specific flags), through SGLang's own extension
points (its choices list, its backend registry, and the registry its DeepSeek model asks how MLA attends). No other backend's name or code is touched."""

from __future__ import annotations

BACKEND_NAME = "atom"


def create_atom_backend(model_runner):
    """SGLang's backend factory signature: ModelRunner -> AttentionBackend (the MLA one when SGLang's runner
    uses MLA, which it decides from the checkpoint's architecture name)."""
    if model_runner.use_mla_backend:
        from atom_sglang.attention.mla import AtomMLAAttnBackend

        return AtomMLAAttnBackend(model_runner)
    from atom_sglang.attention.backend import AtomAttnBackend

    return AtomAttnBackend(model_runner)


def absorbed_mla(attn, forward_batch):
    """SGLang's DeepSeek asks each backend how its MLA layers attend; under `atom` always absorbed (the
    latent pool read in place), never the un-absorbed MHA prefill that SGLang's fallback (triton's rule)
    would pick for fresh prefills."""
    from sglang.srt.models.deepseek_common.attention_forward_methods.forward_methods import AttnForwardMethod

    return AttnForwardMethod.MLA


def register_attention_backend() -> None:
    """Idempotent: SGLang loads plugins once per process, tests may load them again."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    ATTENTION_BACKENDS.setdefault(BACKEND_NAME, create_atom_backend)
    from sglang.srt.models.deepseek_common.attention_backend_handler import AttentionBackendRegistry

    AttentionBackendRegistry.register(BACKEND_NAME, absorbed_mla)
