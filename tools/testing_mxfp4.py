"""Tiny MXFP4 GPT-OSS checkpoints made from random models, and their dequantized twins (shared by atom-core's
and the adapters' tests: every test environment has atom-kernels, torch and safetensors).

The MXFP4 copy is what gpt-oss ships: each layer's experts as `*_blocks` [E, out, in / 32, 16] (e2m1 bytes,
low nibble first) and `*_scales` [E, out, in / 32] (e8m0), written by atom-kernels' quantizer from
transformers' [E, in, out] expert tensors (gate and up columns alternating, so their rows alternate here),
everything else as it was, and the published quantization_config in config.json.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from atom_kernels.moe.mxfp4 import dequantize_mxfp4, quantize_mxfp4

MXFP4 = {
    "quant_method": "mxfp4",
    "modules_to_not_convert": [
        "model.layers.*.self_attn",
        "model.layers.*.mlp.router",
        "model.embed_tokens",
        "lm_head",
    ],
}
EXPERTS = ("experts.gate_up_proj", "experts.down_proj")


def mxfp4_checkpoint(src: Path, dst: Path, *, edit=None) -> Path:
    """The checkpoint at src with every layer's experts in MXFP4 (the published names and layout);
    edit(tensors), if given, changes the tensors before they are written (bad-input tests)."""
    _copy_others(src, dst)
    tensors = load_file(src / "model.safetensors")
    for name in [n for n in tensors if n.endswith(EXPERTS)]:
        blocks, scales = quantize_mxfp4(tensors.pop(name).transpose(1, 2))
        tensors[f"{name}_blocks"], tensors[f"{name}_scales"] = blocks.unflatten(-1, (-1, 16)), scales
    if edit is not None:
        edit(tensors)
    save_file({k: v.contiguous() for k, v in tensors.items()}, dst / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    (dst / "config.json").write_text(json.dumps({**config, "quantization_config": MXFP4}, indent=1))
    return dst


def dequantized_copy(src: Path, dst: Path) -> Path:
    """The MXFP4 checkpoint at src with its experts multiplied out, in fp32 and transformers' layout."""
    _copy_others(src, dst)
    tensors = load_file(src / "model.safetensors")
    for name in [n.removesuffix("_blocks") for n in list(tensors) if n.endswith("_blocks")]:
        blocks, scales = tensors.pop(f"{name}_blocks"), tensors.pop(f"{name}_scales")
        tensors[name] = dequantize_mxfp4(blocks.flatten(-2), scales, torch.float32).transpose(1, 2)
    save_file({k: v.contiguous() for k, v in tensors.items()}, dst / "model.safetensors")
    config = json.loads((src / "config.json").read_text())
    config.pop("quantization_config", None)
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    return dst


def _copy_others(src: Path, dst: Path) -> None:
    """Everything but the weights and config.json (the tokenizer, generation_config.json)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "config.json" and f.is_file():
            shutil.copy(f, dst / f.name)
