"""fp8 (e4m3) KV-cache quantization: the dtype for this device and its largest finite value."""

from __future__ import annotations

import torch

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


def fp8_max(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).max)


def default_fp8_dtype(device: torch.device | None = None) -> torch.dtype:
    """e4m3fn on NVIDIA and the CPU; e4m3fnuz on ROCm's gfx94x GPUs."""
    if device is not None and device.type == "cuda" and torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(device).gcnArchName
        if arch.startswith("gfx94"):
            return torch.float8_e4m3fnuz
    return torch.float8_e4m3fn


def scale_kind(scale: torch.Tensor | None, num_blocks: int, num_kv_heads: int, block_size: int) -> int:
    """0: no scale (bf16/fp16 cache); 1: one per-tensor fp32 scale; 2: per token and head [N, Hkv, B]."""
    if scale is None:
        return 0
    if scale.dtype != torch.float32:
        raise ValueError(f"KV scales must be float32, got {scale.dtype}")
    if scale.numel() == 1:
        return 1
    if tuple(scale.shape) == (num_blocks, num_kv_heads, block_size) and scale.is_contiguous():
        return 2
    raise ValueError(
        f"a KV scale is one value (per tensor) or [num_blocks, Hkv, block_size] = "
        f"{(num_blocks, num_kv_heads, block_size)} contiguous (per token and head), got {tuple(scale.shape)}"
    )
