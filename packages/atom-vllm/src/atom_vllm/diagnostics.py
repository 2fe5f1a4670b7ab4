"""What ran: `LLM(...).apply_model(describe)` reports, per worker, which implementation vLLM instantiated."""

from __future__ import annotations

from torch import nn


def describe(model: nn.Module) -> dict[str, object]:
    """The model class vLLM built, the ATOM model inside it (if any), each attention layer's backend and
    window."""
    atom = getattr(model, "atom", None)
    backends = sorted(
        {
            type(m).__name__ + ":" + m.attn_backend.get_name()
            for m in model.modules()
            if hasattr(m, "attn_backend")
        }
    )
    return {
        "model_class": f"{type(model).__module__}.{type(model).__qualname__}",
        "atom_model_class": None if atom is None else f"{type(atom).__module__}.{type(atom).__qualname__}",
        "attention": backends,
        # each attention layer's window, in model order (None: full attention)
        "windows": [m.sliding_window for m in model.modules() if hasattr(m, "attn_backend")],
    }
