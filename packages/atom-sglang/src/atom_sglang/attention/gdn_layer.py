"""ATOM's Gated DeltaNet layer under SGLang: atom-core's ops on SGLang's mamba state slots.

SGLang keeps a hybrid model's per-request GDN state in the MambaPool of its HybridReqToTokenPool (conv
[slots, conv_dim, W-1] and recurrent [slots, HV, Dv, Dk] per linear layer: atom-kernels' layouts) and builds
the slot of every request in the linear-attention backend's metadata. SGLang always builds its own GDN
backend for these models (inside HybridLinearAttnBackend, beside the selected full-attention backend); this
layer reads that backend's per-forward metadata and computes the conv, gating and delta rule itself. A chain
verify leaves the request's states alone and writes the state after every drafted token to SGLang's
speculative scratch, from which SGLang's worker commits the accepted one.
"""

from __future__ import annotations

import torch
from sglang.srt.model_executor.forward_context import get_attn_backend
from torch import nn

from atom_core.integration import (
    GDNLayerSpec,
    causal_conv1d,
    current_forward_context,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    gdn_gating,
)
from atom_sglang.runtime import FORWARD_BATCH


class SglangGDNLayer(nn.Module):
    """atom-core's GDNLayer contract on SGLang's state slots: (mixed q|k|v [T, conv_dim] before the conv,
    b, a [T, HV], conv_weight [conv_dim, W], A_log, dt_bias [HV]) -> o [T, HV, Dv]."""

    def __init__(self, spec: GDNLayerSpec, layer_id: int):
        super().__init__()
        self.spec, self.layer_id = spec, layer_id

    def forward(self, mixed, b, a, conv_weight, A_log, dt_bias) -> torch.Tensor:
        fb = current_forward_context().metadata_for(FORWARD_BATCH)
        mode = fb.forward_mode
        linear = _linear_backend()
        meta = linear.forward_metadata
        cache = linear.req_to_token_pool.mamba2_layer_cache(self.layer_id)
        state = cache.temporal
        if state.dtype != self.spec.state_dtype:
            raise NotImplementedError(
                f"ATOM's GDN layer {self.spec.prefix} keeps its recurrent state in {self.spec.state_dtype}; "
                f"SGLang allocated {state.dtype} (set --mamba-ssm-dtype float32)"
            )
        if getattr(meta, "has_mamba_track_mask", False):
            raise NotImplementedError(
                "ATOM's GDN layers do not track states for SGLang's mamba radix cache: run with "
                "--disable-radix-cache"
            )
        bs = fb.batch_size
        slots = meta.mamba_cache_indices[:bs]
        weights = (conv_weight, A_log, dt_bias)
        if mode.is_target_verify():
            return self._verify(mixed, b, a, weights, fb, cache, slots)
        if mode.is_decode():
            cu = meta.query_start_loc[: bs + 1]
            started, longest = torch.ones(bs, dtype=torch.bool, device=mixed.device), 1
        elif mode.is_extend() and not mode.is_draft_extend_v2():
            cu = meta.query_start_loc[: bs + 1]
            started, longest = fb.extend_prefix_lens[:bs] > 0, max(fb.extend_seq_lens_cpu)
        else:
            raise NotImplementedError(
                f"ATOM's GDN layers under SGLang run EXTEND, MIXED, DECODE and chain TARGET_VERIFY batches, "
                f"not {mode.name}"
            )
        return self._mix(mixed, b, a, weights, cu, cache.conv[0], cache.temporal, slots, started, longest)

    def _mix(self, mixed, b, a, weights, cu, conv_state, state, slots, started, longest, steps=None):
        conv_weight, A_log, dt_bias = weights
        mixed = causal_conv1d(
            mixed,
            conv_weight,
            None,
            cu,
            conv_state,
            slots,
            has_initial_state=started,
            activation=self.spec.conv_silu,
            max_seqlen=longest,
            step_state_indices=steps,
        )
        q, k, v = self.spec.split_heads(mixed)
        g, beta = gdn_gating(A_log, a, dt_bias, b)
        if steps is None and longest > 1:  # prefill chunks: the chunked form
            return gated_delta_rule_chunked(q, k, v, g, beta, cu, state, slots, has_initial_state=started)
        # decode, or a verify keeping the state after every token: token by token
        return gated_delta_rule_recurrent(
            q, k, v, g, beta, cu, state, slots, has_initial_state=started, step_state_indices=steps
        )

    def _verify(self, mixed, b, a, weights, fb, cache, slots):
        """Chain verify: n drafted tokens per request, each request's states left as they were; the state
        after every token goes to SGLang's speculative scratch (intermediate_ssm / intermediate_conv_window,
        row = the request's batch row), from which SGLang commits the accepted step after verification."""
        spec_info = fb.spec_info
        if getattr(spec_info, "topk", 1) != 1:
            raise NotImplementedError(
                f"ATOM's GDN layers verify chain drafts only (speculative topk 1), got topk {spec_info.topk}"
            )
        bs, n = fb.batch_size, spec_info.draft_token_num
        tokens = bs * n
        conv_state, state = cache.conv[0], cache.temporal
        ssm_out, conv_out = cache.intermediate_ssm, cache.intermediate_conv_window[0]
        if ssm_out.shape[1] < n or ssm_out.shape[0] < bs:
            raise RuntimeError(
                f"SGLang's speculative scratch {tuple(ssm_out.shape)} holds fewer than {bs}x{n} states"
            )
        # Scratch: rows [0, bs) the requests' states, then one row per drafted token.
        live = slots.clamp(min=0).long()
        conv_rows = torch.cat([conv_state[live], conv_state.new_empty(tokens, *conv_state.shape[1:])])
        state_rows = torch.cat([state[live], state.new_empty(tokens, *state.shape[1:])])
        rows = torch.arange(bs, dtype=slots.dtype, device=slots.device)
        rows = torch.where(slots >= 0, rows, torch.full_like(rows, -1))  # padding rows: no state
        steps = torch.arange(bs, bs + tokens, dtype=slots.dtype, device=slots.device)
        cu = torch.arange(0, tokens + 1, n, dtype=torch.int32, device=mixed.device)
        started = torch.ones(bs, dtype=torch.bool, device=mixed.device)
        out = self._mix(mixed, b, a, weights, cu, conv_rows, state_rows, rows, started, n, steps)
        conv_out[:bs, :n] = conv_rows[bs:].view(bs, n, *conv_state.shape[1:])
        ssm_out[:bs, :n] = state_rows[bs:].view(bs, n, *state.shape[1:])
        return out


def _linear_backend():
    """SGLang's linear-attention backend of this forward (the GDN half of the HybridLinearAttnBackend that
    SGLang publishes): its per-forward metadata and its HybridReqToTokenPool."""
    backend = get_attn_backend()
    linear = getattr(backend, "linear_attn_backend", None)
    if linear is None or linear.forward_metadata is None:
        raise RuntimeError(
            f"ATOM's GDN layers read SGLang's linear-attention metadata; the forward's backend "
            f"{type(backend).__name__} has none (SGLang wraps hybrid models' backends in "
            "HybridLinearAttnBackend)"
        )
    return linear
