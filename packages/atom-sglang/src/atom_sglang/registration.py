"""What the plugin registers with SGLang: the attention backend "atom", selectable with
`--attention-backend atom` (also for the prefill/decode-specific flags), through SGLang's own extension
points (its choices list and its backend registry). No other backend's name or code is touched."""

from __future__ import annotations

BACKEND_NAME = "atom"


def create_atom_backend(model_runner):
    """SGLang's backend factory signature: ModelRunner -> AttentionBackend."""
    from atom_sglang.attention.backend import AtomAttnBackend

    return AtomAttnBackend(model_runner)


def register_attention_backend() -> None:
    """Idempotent: SGLang loads plugins once per process, tests may load them again."""
    from sglang.srt.arg_groups.choices import ATTENTION_BACKEND_CHOICES, add_attention_backend_choices
    from sglang.srt.layers.attention.attention_registry import ATTENTION_BACKENDS

    if BACKEND_NAME not in ATTENTION_BACKEND_CHOICES:
        add_attention_backend_choices([BACKEND_NAME])
    ATTENTION_BACKENDS.setdefault(BACKEND_NAME, create_atom_backend)
