"""Gated DeltaNet's stateful step, once for every engine: the causal conv continuing from the conv state,
the gating, and the gated delta rule over the recurrent state, with the one rule that picks the chunked or
the token-by-token form and the speculative state bookkeeping of each way engines keep drafts' states.

Engines keep a layer's states in slots and describe a step with a view of them; the native backend,
atom-vllm and atom-sglang only translate their own metadata into one of these views:
  - GDNStepView: each sequence continues from its slot and writes it back (prefill chunks, decodes,
    mixed batches); for a verify step, the state after each token also goes to a slot of its own
    (step_slots), from which the engine commits the accepted one (the native engine renames slots);
    a prefill chunk may also keep its state partway through in a slot of its own (snapshots: the
    native engine's prefix cache).
  - GDNBlockVerify: each verifying sequence owns k + 1 state blocks and resumes from the block of the
    last accepted token (vLLM's layout): the commit is the read at the next step.
  - GDNScratchVerify: the sequences' states stay as they were and the state after each token goes to
    scratch rows (SGLang's), from which the engine commits the accepted one.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from atom_core.ops import (
    ChunkPlan,
    Gating,
    Snapshots,
    causal_conv1d,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    gdn_gating,
)

if TYPE_CHECKING:  # (gdn.py's native layer calls this module)
    from atom_core.attention.gdn import GDNLayerSpec


@dataclass(frozen=True, slots=True)
class GDNStates:
    """One layer's states, where the engine allocates them. conv: [slots, conv_dim, >= W-1], the last W-1
    inputs first (any strides: a window that is not a contiguous [slots, conv_dim, W-1] is gathered and
    written back); recurrent: [slots, HV, Dv, Dk] in the spec's state dtype."""

    conv: torch.Tensor
    recurrent: torch.Tensor


@dataclass(frozen=True, slots=True)
class GDNStepView:
    """cu_seqlens: [N+1] int32, each sequence's tokens back to back; slots: [N] int, the slot each continues
    from and writes back (-1: padding, no state touched, output rows zero); started: [N] bool or int8 (False /
    0: starts from zeros), None when every sequence continues; max_query_len: the longest sequence's tokens or
    a bound on it (above 1 without step_slots: the chunked form); step_slots: [T] int, a verify step's slot
    for the state after each token (the sequence's own slot is then left alone); chunk_plan: the chunked
    form's plan_chunks(cu_seqlens, T, snapshots' lens), when the engine makes it once a forward (else each
    layer makes its own); snapshots: per sequence, a slot that keeps the state after the first lens[i] of its
    tokens (the chunked form only: never with step_slots)."""

    cu_seqlens: torch.Tensor
    slots: torch.Tensor
    started: torch.Tensor | None
    max_query_len: int
    step_slots: torch.Tensor | None = None
    chunk_plan: ChunkPlan | None = None
    snapshots: Snapshots | None = None

    @property
    def chunked(self) -> bool:
        """Whether the delta rule takes the chunked form (prefill chunks) rather than token by token."""
        return chunked_form(self.max_query_len, self.step_slots)


def chunked_form(max_query_len: int, step_slots: torch.Tensor | None) -> bool:
    """The one rule: sequences of more than one token take the chunked form, unless a verify step keeps
    the state after every token (only the token-by-token form does)."""
    return step_slots is None and max_query_len > 1


@dataclass(frozen=True, slots=True)
class GDNBlockVerify:
    """A verify step over per-draft state blocks. blocks: [N, k+1], a sequence's blocks; the recurrent
    state after its t-th token of this step goes to block t, and the step resumes from block
    accepted - 1 (accepted: [N], the last verify's accepted tokens, the bonus token included, >= 1).
    The conv state is block 0's buffer of W - 1 + k inputs: the window before the step's first token starts
    at column accepted - 1, and after the step the buffer holds that window's last W - 2 inputs, then the
    step's tokens, so that the next step's window ends at its last accepted token."""

    cu_seqlens: torch.Tensor
    blocks: torch.Tensor
    accepted: torch.Tensor


@dataclass(frozen=True, slots=True)
class GDNScratchVerify:
    """A verify step of tokens_per_seq tokens a sequence that leaves the sequences' states (slots: [N],
    -1: padding) as they were; the states after token t of sequence i go to scratch.conv[i, t] and
    scratch.recurrent[i, t] (conv [>= N, >= n, conv_dim, W-1], recurrent [>= N, >= n, HV, Dv, Dk])."""

    slots: torch.Tensor
    tokens_per_seq: int
    scratch: GDNStates


GDNView = GDNStepView | GDNBlockVerify | GDNScratchVerify


def gdn_step(
    spec: GDNLayerSpec,
    mixed: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    states: GDNStates,
    view: GDNView,
) -> torch.Tensor:
    """mixed: q|k|v [T, conv_dim] before the conv; b, a: [T, HV]; conv_weight [conv_dim, W]; A_log,
    dt_bias [HV] -> o [T, HV, Dv], each sequence continuing from its states as the view says."""
    weights = (conv_weight, A_log, dt_bias)
    if isinstance(view, GDNStepView):
        return _slot_step(spec, mixed, b, a, weights, states, view)
    if isinstance(view, GDNBlockVerify):
        return _block_verify(spec, mixed, b, a, weights, states, view)
    if isinstance(view, GDNScratchVerify):
        return _scratch_verify(spec, mixed, b, a, weights, states, view)
    raise TypeError(f"gdn_step: unknown view {type(view).__name__}")


def _delta_rule(
    spec, mixed, b, a, weights, cu, recurrent, slots, started, chunked, steps=None, plan=None, snapshots=None
):
    """The conv's output mixed -> the gated delta rule's o, chunked (with plan, if made, and keeping
    snapshots) or token by token (keeping the state after each token in steps)."""
    _, A_log, dt_bias = weights
    q, k, v = spec.split_heads(mixed)
    if chunked:
        g, beta = gdn_gating(A_log, a, dt_bias, b)
        return gated_delta_rule_chunked(
            q, k, v, g, beta, cu, recurrent, slots, has_initial_state=started, plan=plan, snapshots=snapshots
        )
    if snapshots is not None:
        raise ValueError(f"{spec.prefix}: snapshots are kept by the chunked form (a prefill chunk) only")
    return gated_delta_rule_recurrent(  # token by token, the gating computed in the same kernel
        q, k, v, None, None, cu, recurrent, slots, has_initial_state=started, step_state_indices=steps,
        gating=Gating(A_log, a, dt_bias, b),
    )  # fmt: skip


def _slot_step(spec, mixed, b, a, weights, states: GDNStates, view: GDNStepView) -> torch.Tensor:
    width = spec.conv_width
    conv, slots = states.conv, view.slots
    # the kernels read int8 flags: converted once for both of them (a no-op on the engine's, int8 already)
    started = None if view.started is None else view.started.to(torch.int8)
    gathered = conv.stride(-1) != 1 or conv.shape[-1] != width - 1
    if gathered:  # the conv kernel takes [slots, D, W-1] windows with unit last stride: work on a copy
        if view.step_slots is not None or view.snapshots is not None:
            raise ValueError(f"{spec.prefix}: kept conv states need [slots, conv_dim, W-1] windows")
        rows = slots.long().clamp(min=0)
        conv = states.conv[rows, :, : width - 1].contiguous()
        slots = torch.where(
            view.slots >= 0, torch.arange(rows.numel(), dtype=view.slots.dtype, device=rows.device), -1
        )
    x = causal_conv1d(
        mixed,
        weights[0],
        None,
        view.cu_seqlens,
        conv,
        slots,
        has_initial_state=started,
        activation=spec.conv_silu,
        max_seqlen=view.max_query_len,
        step_state_indices=view.step_slots,
        snapshots=view.snapshots,
    )
    if gathered:
        live = view.slots >= 0
        states.conv[rows[live], :, : width - 1] = conv[live]
    return _delta_rule(
        spec, x, b, a, weights, view.cu_seqlens, states.recurrent, view.slots, started, view.chunked,
        view.step_slots, view.chunk_plan, view.snapshots,
    )  # fmt: skip


def _block_verify(spec, mixed, b, a, weights, states: GDNStates, view: GDNBlockVerify) -> torch.Tensor:
    width, cu, blocks = spec.conv_width, view.cu_seqlens, view.blocks
    count, device = blocks.shape[0], mixed.device
    buffer = states.conv
    if buffer.shape[-1] < width - 2 + blocks.shape[1]:
        raise ValueError(
            f"{spec.prefix}: a conv buffer of {buffer.shape[-1]} inputs cannot hold W - 2 + {blocks.shape[1]}"
        )
    accepted = view.accepted.long()
    lens = (cu[1:] - cu[:-1]).long()
    home = blocks[:, 0].long()
    # the W - 1 inputs before each sequence's first token (a gathered copy the conv updates)
    cols = (accepted - 1)[:, None] + torch.arange(width - 1, device=device)[None, :]
    window = buffer[
        home[:, None, None], torch.arange(buffer.shape[1], device=device)[None, :, None], cols[:, None, :]
    ]
    kept = window[:, :, 1:].clone()
    own = torch.arange(count, dtype=torch.int32, device=device)
    x = causal_conv1d(mixed, weights[0], None, cu, window, own, activation=spec.conv_silu)
    request = torch.repeat_interleave(torch.arange(count, device=device), lens)
    position = torch.arange(mixed.shape[0], device=device) - cu[:-1].long()[request]
    buffer[home, :, : width - 2] = kept
    buffer[home[request], :, width - 2 + position] = mixed.to(buffer.dtype)
    resume = blocks.gather(1, (accepted - 1)[:, None]).squeeze(1)
    steps = blocks[request, position]
    return _delta_rule(spec, x, b, a, weights, cu, states.recurrent, resume, None, False, steps)


def _scratch_verify(spec, mixed, b, a, weights, states: GDNStates, view: GDNScratchVerify) -> torch.Tensor:
    slots, n = view.slots, view.tokens_per_seq
    count, device = slots.numel(), mixed.device
    tokens = count * n
    if mixed.shape[0] != tokens:
        raise ValueError(f"{spec.prefix}: a verify of {count} x {n} tokens got {mixed.shape[0]} rows")
    conv_out, state_out = view.scratch.conv, view.scratch.recurrent
    if state_out.shape[0] < count or state_out.shape[1] < n or conv_out.shape[:2] != state_out.shape[:2]:
        raise ValueError(
            f"{spec.prefix}: scratch {tuple(state_out.shape)} holds fewer than {count}x{n} states"
        )
    # working rows: [0, count) the sequences' states (copies: theirs stay as they were), then one per token
    live = slots.clamp(min=0).long()
    conv = torch.cat([states.conv[live], states.conv.new_empty(tokens, *states.conv.shape[1:])])
    recurrent = torch.cat(
        [states.recurrent[live], states.recurrent.new_empty(tokens, *states.recurrent.shape[1:])]
    )
    rows = torch.where(slots >= 0, torch.arange(count, dtype=slots.dtype, device=device), -1)
    steps = torch.arange(count, count + tokens, dtype=slots.dtype, device=device)
    cu = torch.arange(0, tokens + 1, n, dtype=torch.int32, device=device)
    x = causal_conv1d(
        mixed,
        weights[0],
        None,
        cu,
        conv,
        rows,
        activation=spec.conv_silu,
        max_seqlen=n,
        step_state_indices=steps,
    )
    out = _delta_rule(spec, x, b, a, weights, cu, recurrent, rows, None, False, steps)
    conv_out[:count, :n] = conv[count:].view(count, n, *conv.shape[1:])
    state_out[:count, :n] = recurrent[count:].view(count, n, *recurrent.shape[1:])
    return out
