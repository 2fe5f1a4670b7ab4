"""Pure-torch references for gated delta net (GDN) layers (Qwen3-Next, Qwen3.5), fp32 math.

Layouts: tokens of all sequences back to back (cu_seqlens [S+1]); q, k [T, HK, Dk]; v [T, HV, Dv] with
HV a multiple of HK (each key head serves HV / HK value heads); g, beta [T, HV]. Recurrent state per
request slot: [slots, HV, Dv, Dk] (value-major), state_indices [S] picks each sequence's slot (-1: a
padding sequence, nothing read or written). Per token, with S the state of its head:
    S <- exp(g) * S;  S <- S + beta * (v - S k) k^T;  o = S q / sqrt(Dk)
(q and k optionally L2-normalized first), which is transformers' torch_recurrent_gated_delta_rule.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from atom_kernels.gdn.call import ConvCall, GdnCall


def gdn_gating_ref(A_log, a, dt_bias, b) -> tuple[torch.Tensor, torch.Tensor]:
    """g = -exp(A_log) * softplus(a + dt_bias) (fp32), beta = sigmoid(b) (b's dtype): [T, HV] each."""
    g = -A_log.float().exp() * F.softplus(a.float() + dt_bias.float())
    return g, b.sigmoid()


def l2norm_ref(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True) + eps)


def gated_delta_rule_ref(call: GdnCall) -> torch.Tensor:
    """Runs each sequence from its slot's state (zeros where has_initial_state is False) and writes the
    final state back into the slot, or with step_state_indices [T] the state after each token t into slot
    step_state_indices[t] (-1: kept nowhere) and nothing into the sequence's own slot (unless named);
    a snapshot's state goes to its slot after its first lens[s] tokens.
    Returns o [T, HV, Dv] in v's dtype; padding sequences' rows are zero."""
    q, k, v, g, beta, state = call.q, call.k, call.v, call.g, call.beta, call.state
    out = torch.zeros_like(v)
    group = v.shape[1] // k.shape[1]
    for slot, start, end, keep, snapshot in call.slots.spans():
        qs, ks = (x[start:end].float().repeat_interleave(group, dim=1) for x in (q, k))
        if call.use_qk_l2norm:
            qs, ks = l2norm_ref(qs), l2norm_ref(ks)
        qs = qs * qs.shape[-1] ** -0.5
        vs, gs, bs = v[start:end].float(), g[start:end].float(), beta[start:end].float()
        h = state[slot].float().clone() if keep else torch.zeros_like(state[slot], dtype=torch.float32)
        for t in range(end - start):  # h: [HV, Dv, Dk]
            h = h * gs[t].exp()[:, None, None]
            delta = (vs[t] - torch.einsum("hvk,hk->hv", h, ks[t])) * bs[t][:, None]
            h = h + delta[:, :, None] * ks[t][:, None, :]
            out[start + t] = torch.einsum("hvk,hk->hv", h, qs[t]).to(v.dtype)
            if (step := call.slots.step_slot(start + t)) >= 0:
                state[step] = h.to(state.dtype)
            if snapshot is not None and snapshot[1] == t + 1:
                state[snapshot[0]] = h.to(state.dtype)
        if call.slots.step_state_indices is None:
            state[slot] = h.to(state.dtype)
    return out


def causal_conv1d_ref(call: ConvCall) -> torch.Tensor:
    """Depthwise causal conv over each sequence of x [T, D] with weight [D, W], continuing from the slot's
    last W-1 inputs conv_state [slots, D, W-1] (zeros where has_initial_state is False), then SiLU.
    Writes the sequence's last W-1 inputs back to its slot, or with step_state_indices [T] the last W-1
    inputs up to each token t into slot step_state_indices[t] (-1: kept nowhere) instead; a snapshot
    keeps the last W-1 inputs up to its first lens[s] tokens in its slot.
    Returns [T, D] in x's dtype."""
    x, weight, bias, conv_state = call.x, call.weight, call.bias, call.conv_state
    out = torch.zeros_like(x)
    width = weight.shape[1]
    for slot, start, end, keep, snapshot in call.slots.spans():
        history = (
            conv_state[slot].float() if keep else torch.zeros_like(conv_state[slot], dtype=torch.float32)
        )
        seq = torch.cat([history, x[start:end].float().t()], dim=1)  # [D, W-1 + L]
        y = F.conv1d(
            seq[None],
            weight.float()[:, None, :],
            bias.float() if bias is not None else None,
            groups=x.shape[1],
        )[0]
        y = F.silu(y) if call.activation else y
        out[start:end] = y.t().to(x.dtype)
        if snapshot is not None:  # the window ending at token n - 1: columns n .. n+W-2 of seq
            n = snapshot[1]
            conv_state[snapshot[0]] = seq[:, n : n + width - 1].to(conv_state.dtype)
        if call.slots.step_state_indices is None:
            conv_state[slot] = seq[:, -(width - 1) :].to(conv_state.dtype)
            continue
        for t in range(end - start):  # the window ending at token t: columns t+1 .. t+W-1 of seq
            if (step := call.slots.step_slot(start + t)) >= 0:
                conv_state[step] = seq[:, t + 1 : t + width].to(conv_state.dtype)
    return out
