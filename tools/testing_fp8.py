"""Tiny block-quantized fp8 checkpoints made from random models, and their dequantized twins (shared by
atom-core's and the adapters' tests: every test environment has atom-kernels, torch and safetensors).

The fp8 copy is what DeepSeek-V3 / Qwen3.5-FP8 ship: e4m3 `weight` + `weight_scale_inv` (block absmax /
448) for the projections, everything else as it was, and `quantization_config` in config.json. The
dequantized twin (each weight = q * scale, written without quantization_config) is the reference model
transformers runs: its own fp8 loader infers the block from the shapes and is wrong on ragged tensors.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from atom_kernels.fp8.ref import dequantize_weight_ref, quantize_weight_ref

# Never quantized in the published fp8 checkpoints: embeddings, heads, norms, routers, gates, convs, Gated
# DeltaNet's small b/a projections (their modules_to_not_convert lists them) and the MTP layers' input
# projections (DeepSeek's eh_proj, Qwen's mtp.fc) and DeepSeek's MTP shared_head.
KEEP = (
    "embed_tokens",
    "lm_head",
    "norm",
    "mlp.gate.",
    "block_sparse_moe.gate.",
    "shared_expert_gate",
    "in_proj_a",
    "in_proj_b",
    "conv1d",
    "eh_proj",
    "shared_head",
    "mtp.fc",
)
NOT_CONVERT = ("in_proj_a", "in_proj_b", "in_proj_ba")


def is_projection(name: str, tensor: torch.Tensor) -> bool:
    return name.endswith(".weight") and tensor.dim() == 2 and not any(k in name for k in KEEP)


def quantize_checkpoint(
    src: Path,
    dst: Path,
    block: tuple[int, int],
    *,
    scale_dtype: torch.dtype = torch.float32,
    extra_config: dict | None = None,
    with_not_convert: bool = False,
) -> list[str]:
    """Writes src's fp8 copy to dst; returns the quantized weights' names."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors" and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    quantized: list[str] = []
    for file in sorted(src.glob("*.safetensors")):
        out = {}
        for name, tensor in load_file(file).items():
            if is_projection(name, tensor):
                out[name], out[name + "_scale_inv"] = quantize_weight_ref(tensor, block, scale_dtype)
                quantized.append(name)
            else:
                out[name] = tensor
        save_file(out, dst / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((src / "config.json").read_text())
    qc = dict(quant_method="fp8", fmt="e4m3", activation_scheme="dynamic", weight_block_size=list(block))
    if with_not_convert:
        names = load_file(dst / "model.safetensors")
        layers = {n[: n.index(".linear_attn.") + len(".linear_attn")] for n in names if ".linear_attn." in n}
        qc["modules_to_not_convert"] = [*sorted(f"{la}.{m}" for la in layers for m in NOT_CONVERT), "lm_head"]
    qc.update(extra_config or {})
    config["quantization_config"] = qc
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    return quantized


def dequantized_copy(src: Path, dst: Path) -> None:
    """The fp8 checkpoint at src with every (weight, weight_scale_inv) pair multiplied out, in fp32."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.suffix != ".safetensors":
            shutil.copy(f, dst / f.name)
    config = json.loads((src / "config.json").read_text())
    block = tuple(config.pop("quantization_config")["weight_block_size"])
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    tensors = load_file(src / "model.safetensors")
    out = {}
    for name, tensor in tensors.items():
        if name.endswith("_scale_inv"):
            continue
        scale = tensors.get(name + "_scale_inv")
        out[name] = tensor if scale is None else dequantize_weight_ref(tensor, scale, block)
    save_file(out, dst / "model.safetensors", metadata={"format": "pt"})


def edit_checkpoint(path: Path, edit) -> None:
    """Rewrites path's model.safetensors with edit(tensors) applied in place (bad-input tests)."""
    tensors = load_file(path / "model.safetensors")
    edit(tensors)
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
