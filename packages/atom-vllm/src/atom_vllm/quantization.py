"""vLLM's names for the checkpoint formats atom-core reads itself: vLLM rewrites a gpt-oss checkpoint's
quant_method "mxfp4" to its own "gpt_oss_mxfp4" method; ATOM's model gets the checkpoint's name back."""

from __future__ import annotations

from typing import Any

CHECKPOINT_NAMES = {"gpt_oss_mxfp4": "mxfp4"}  # vLLM's quantization method -> the checkpoint's quant_method


def checkpoint_config(hf: dict[str, Any]) -> dict[str, Any]:
    """vLLM's hf_config dict with quantization_config's quant_method as the checkpoint names it."""
    declared = hf.get("quantization_config")
    if not isinstance(declared, dict) or declared.get("quant_method") not in CHECKPOINT_NAMES:
        return hf
    return {
        **hf,
        "quantization_config": {**declared, "quant_method": CHECKPOINT_NAMES[declared["quant_method"]]},
    }
