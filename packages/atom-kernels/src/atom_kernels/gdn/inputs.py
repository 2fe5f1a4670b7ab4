"""What both gated-delta-rule entry points share: input checks, the output buffer and the torch path."""

from __future__ import annotations

import torch
import triton

from atom_kernels.gdn.call import GdnCall
from atom_kernels.gdn.ref import gated_delta_rule_ref
from atom_kernels.settings import Backend, resolve_backend


def check_gdn_inputs(call: GdnCall) -> None:
    q, k, v, g, beta, state = call.q, call.k, call.v, call.g, call.beta, call.state
    cu_seqlens, state_indices = call.slots.cu_seqlens, call.slots.state_indices
    tokens, num_k_heads, dk = q.shape if q.dim() == 3 else (0, 0, 0)
    if q.dim() != 3 or k.shape != q.shape or v.dim() != 3 or v.shape[0] != tokens:
        raise ValueError(
            f"q, k [T, HK, Dk] and v [T, HV, Dv] expected, got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}"
        )
    num_v_heads, dv = v.shape[1], v.shape[2]
    if num_v_heads % num_k_heads:
        raise ValueError(f"value heads ({num_v_heads}) must be a multiple of key heads ({num_k_heads})")
    if g is not None and (g.shape != (tokens, num_v_heads) or beta.shape != (tokens, num_v_heads)):
        raise ValueError(
            f"g and beta must be [T, HV] = {(tokens, num_v_heads)}, got {tuple(g.shape)}, {tuple(beta.shape)}"
        )
    if state.dim() != 4 or state.shape[1:] != (num_v_heads, dv, dk) or not state[0].is_contiguous():
        raise ValueError(
            f"state must be [slots, {num_v_heads}, {dv}, {dk}] (per slot contiguous), got {tuple(state.shape)}"
        )
    if cu_seqlens.shape != (state_indices.numel() + 1,):
        raise ValueError(
            f"cu_seqlens [S+1] and state_indices [S] disagree: {tuple(cu_seqlens.shape)}, {tuple(state_indices.shape)}"
        )
    if (g is not None and not (g.is_contiguous() and beta.is_contiguous())) or min(
        x.stride(-1) for x in (q, k, v)
    ) != 1:
        raise ValueError("g and beta must be contiguous, and q, k, v need a contiguous last dimension")
    check_gdn_head_sizes(dk, dv, v.dtype)


# The chunked state kernel keeps a chunk's keys (w and the decayed keys, [64, padded Dk]) in shared memory
# for each stage of its pipelined loop: 256 padded key columns fit in 16-bit activations, 128 in fp32.
MAX_PADDED_KEY_BYTES = 512


def padded_head_size(size: int) -> int:
    """The width a kernel holds a head of `size` at: a power of two (Triton's blocks), at least 16 (the
    smallest matmul operand); the columns past `size` are masked to zeros."""
    return max(16, triton.next_power_of_2(size))


def max_key_head_size(dtype: torch.dtype) -> int:
    """The widest key head the kernels take with activations of `dtype` (any value head size works)."""
    return MAX_PADDED_KEY_BYTES // dtype.itemsize


def check_gdn_head_sizes(dk: int, dv: int, dtype: torch.dtype) -> None:
    """ValueError unless the kernels take key heads of dk and value heads of dv in `dtype` activations."""
    if dk < 1 or dv < 1:
        raise ValueError(f"head dims must be positive, got Dk={dk}, Dv={dv}")
    if dk > max_key_head_size(dtype):
        raise ValueError(
            f"key heads of {dk} are wider than the chunked kernel's {max_key_head_size(dtype)} with {dtype} "
            "activations (its shared memory holds a chunk's padded keys per pipeline stage)"
        )


def unit_stride(*index_tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    """The per-sequence / per-token index tensors (cu_seqlens, state slots, has_initial_state) as the
    kernels read them: element i at offset i. Engines hand column views (vLLM's state slots are column 0
    of its block table, stride = the table's width), which a kernel indexing with unit stride would read
    as other requests' slots; a strided one is copied (S elements, on the device, capturable)."""
    return tuple(t.contiguous() if t is not None else None for t in index_tensors)


def gdn_entry(
    call: GdnCall, *, out: torch.Tensor | None, backend: Backend | str | None
) -> tuple[torch.Tensor, bool]:
    """Checks the inputs and allocates out; on the torch backend also computes the result.
    Returns (out, done): done means the reference already wrote out and the state."""
    check_gdn_inputs(call)
    tokens, steps = call.q.shape[0], call.slots.step_state_indices
    if steps is not None and steps.shape != (tokens,):
        raise ValueError(f"step_state_indices must be [T] = [{tokens}], got {tuple(steps.shape)}")
    if out is None:
        out = torch.empty_like(call.v, memory_format=torch.contiguous_format)
    if resolve_backend(backend, call.v.device) is not Backend.TORCH:
        return out, False
    return out.copy_(gated_delta_rule_ref(call)), True
