"""Per-layer attention windows, derived from a checkpoint's config the way transformers derives them.

Each family reads its own fields, so each has its own rule; a model class names its rule and passes each
layer's window to the attention backend. A window W means a token sees the W most recent positions, itself
included (transformers' mask `k > q - W`, and atom-kernels' `sliding_window`); None is full attention.
A config that asks for a layer kind ATOM does not implement is refused with the field and its value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from atom_core.config import ConfigError, ModelConfig

Windows = tuple[int | None, ...]  # one entry per decoder layer

FULL, SLIDING = "full_attention", "sliding_attention"


def llama_windows(config: ModelConfig) -> Windows:
    """Llama: full attention. transformers' Llama ignores `sliding_window` in its forward, yet its KV cache
    keeps only that many positions (so cached decode differs from a full forward): with no one answer to
    match, a Llama config that sets it is refused."""
    if config.hf.get("sliding_window") is not None:
        raise ConfigError(
            f"{config.architecture} sets sliding_window={config.hf['sliding_window']!r}: transformers' Llama "
            "attends fully in a forward but keeps only that window in its KV cache, so ATOM refuses to pick "
            "one; remove the field (or set it to null) for full attention"
        )
    return (None,) * config.num_hidden_layers


def qwen3_windows(config: ModelConfig) -> Windows:
    """Qwen3: `layer_types` where given; else layers from `max_window_layers` on slide when
    `use_sliding_window` is set (transformers' Qwen3Config)."""
    hf = config.hf
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window", False) else None
    types = hf.get("layer_types")
    if types is None:
        first = hf.get("max_window_layers", 28)
        types = [
            SLIDING if window is not None and i >= first else FULL for i in range(config.num_hidden_layers)
        ]
    return windows_from_layer_types(config, types, window)


def qwen3_moe_windows(config: ModelConfig) -> Windows:
    """Qwen3-MoE: one window on every layer when `use_sliding_window` is set; transformers' Qwen3-MoE
    reads neither `layer_types` nor `max_window_layers`."""
    hf = config.hf
    window = hf.get("sliding_window", 4096) if hf.get("use_sliding_window", False) else None
    return windows_from_layer_types(
        config, [FULL if window is None else SLIDING] * config.num_hidden_layers, window
    )


def qwen2_moe_windows(config: ModelConfig) -> Windows:
    """Qwen2-MoE: `layer_types` where given; else every other layer (0, 2, ...) below `max_window_layers`
    slides when `use_sliding_window` is set (transformers' Qwen2MoeConfig)."""
    hf = config.hf
    on = hf.get("use_sliding_window", False)
    window = hf.get("sliding_window", 4096) if on else None
    types = hf.get("layer_types")
    if types is None:
        first_full = hf.get("max_window_layers", 28)
        types = [
            SLIDING if on and i % 2 == 0 and i < first_full else FULL for i in range(config.num_hidden_layers)
        ]
    return windows_from_layer_types(config, types, window)


def windows_from_layer_types(config: ModelConfig, layer_types: Sequence[Any], window: Any) -> Windows:
    """Full or sliding per layer; anything else, a list of the wrong length, or a sliding layer without a
    positive window is refused by name."""
    if not isinstance(layer_types, list | tuple) or len(layer_types) != config.num_hidden_layers:
        raise ConfigError(
            f"layer_types must list one kind per layer ({config.num_hidden_layers}), got {layer_types!r}"
        )
    unknown = sorted({str(t) for t in layer_types} - {FULL, SLIDING})
    if unknown:
        raise ConfigError(
            f"layer_types {unknown} of {config.architecture} are not supported (supported: {FULL}, {SLIDING})"
        )
    if SLIDING in layer_types and (isinstance(window, bool) or not isinstance(window, int) or window < 1):
        raise ConfigError(
            f"layer_types asks for {SLIDING} but the window is {window!r} (sliding_window with "
            f"use_sliding_window={config.hf.get('use_sliding_window', False)!r}): it must be a positive integer"
        )
    return tuple(window if t == SLIDING else None for t in layer_types)
