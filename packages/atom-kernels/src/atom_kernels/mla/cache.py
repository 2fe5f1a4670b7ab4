"""MLA latent-cache write: each token's compressed kv and rope key into one cache row, bf16/fp16 or fp8."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from atom_kernels.cache.fp8 import fp8_max, is_fp8
from atom_kernels.mla.ref import write_latent_ref
from atom_kernels.pdl import let_next_launch, pdl_launch, wait_for_inputs
from atom_kernels.settings import Backend, resolve_backend


def check_latent_dtype(
    cache: torch.Tensor, scale: torch.Tensor | None, dtype: torch.dtype, name: str
) -> bool:
    """A latent cache is in the activations' dtype, or fp8 with a one-element fp32 scale; returns is-fp8."""
    fp8 = is_fp8(cache.dtype)
    if fp8 and (scale is None or scale.numel() != 1 or scale.dtype != torch.float32):
        raise ValueError("an fp8 latent cache needs scale: a one-element float32 tensor")
    if not fp8 and cache.dtype != dtype:
        raise ValueError(f"cache dtype {cache.dtype} must be {name}'s ({dtype}) or fp8")
    return fp8


@triton.jit
def _write_latent_kernel(
    kv_c_ptr,
    k_pe_ptr,
    cache_ptr,
    slot_ptr,
    scale_ptr,
    stride_c,
    stride_pe,
    fp8_limit,
    RANK: tl.constexpr,
    ROPE: tl.constexpr,
    FP8: tl.constexpr,
    PDL: tl.constexpr,
):
    let_next_launch(PDL)
    wait_for_inputs(PDL)  # the slots and the new rows are the step's
    t = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + t).to(tl.int64)
    if slot < 0:  # padding token: nothing to write
        return
    row = cache_ptr + slot * (RANK + ROPE)  # int64: slot * 576 passes 2^31 in large caches
    c = tl.arange(0, RANK)
    r = tl.arange(0, ROPE)
    kv = tl.load(kv_c_ptr + t * stride_c + c).to(tl.float32)
    pe = tl.load(k_pe_ptr + t * stride_pe + r).to(tl.float32)
    if FP8:
        scale = tl.load(scale_ptr)  # divided, not multiplied by 1/scale: rounds as the reference does
        kv = tl.clamp(kv / scale, -fp8_limit, fp8_limit)
        pe = tl.clamp(pe / scale, -fp8_limit, fp8_limit)
    tl.store(row + c, kv.to(cache_ptr.dtype.element_ty))
    tl.store(row + RANK + r, pe.to(cache_ptr.dtype.element_ty))


def write_latent(
    kv_c: torch.Tensor,
    k_pe: torch.Tensor,
    cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    *,
    scale: torch.Tensor | None = None,
    backend: Backend | str | None = None,
) -> None:
    """Write cache rows: cache.view(-1, R + P)[slot] = [kv_c | k_pe] for every token with slot >= 0.

    kv_c: [T, R] (R = kv_lora_rank, power of two); k_pe: [T, P] (rope dim, power of two); rows may be
    strided, last dims contiguous. cache: [N, B, R + P] contiguous, kv's dtype or fp8 e4m3 (then scale:
    [1] fp32 per-tensor, stored values are x / scale saturated to the fp8 range). slot_mapping: [T] int.
    """
    if kv_c.dim() != 2 or k_pe.dim() != 2 or k_pe.shape[0] != kv_c.shape[0]:
        raise ValueError(
            f"kv_c [T, R] and k_pe [T, P] expected, got {tuple(kv_c.shape)} and {tuple(k_pe.shape)}"
        )
    rank, rope = kv_c.shape[1], k_pe.shape[1]
    if cache.dim() != 3 or cache.shape[2] != rank + rope or not cache.is_contiguous():
        raise ValueError(f"cache must be a contiguous [N, B, {rank + rope}] tensor, got {tuple(cache.shape)}")
    if slot_mapping.shape != (kv_c.shape[0],):
        raise ValueError(f"slot_mapping must be [{kv_c.shape[0]}], got {tuple(slot_mapping.shape)}")
    fp8 = check_latent_dtype(cache, scale, kv_c.dtype, "kv_c")
    if kv_c.stride(-1) != 1 or k_pe.stride(-1) != 1:
        raise ValueError("kv_c and k_pe need a contiguous last dimension")
    if resolve_backend(backend, kv_c.device) is Backend.TORCH:
        write_latent_ref(kv_c, k_pe, cache, slot_mapping, scale if fp8 else None)
        return
    pow2 = triton.next_power_of_2
    if pow2(rank) != rank or pow2(rope) != rope:
        raise ValueError(f"the Triton latent write needs power-of-two widths, got {rank} and {rope}")
    if kv_c.shape[0]:
        pdl = pdl_launch(kv_c.device)
        _write_latent_kernel[(kv_c.shape[0],)](
            kv_c, k_pe, cache, slot_mapping, scale if fp8 else cache, kv_c.stride(0), k_pe.stride(0),
            fp8_max(cache.dtype) if fp8 else 0.0, RANK=rank, ROPE=rope, FP8=fp8, PDL=pdl, launch_pdl=pdl,
        )  # fmt: skip
