"""ATOM's Gated DeltaNet layer under SGLang: atom-core's ops on SGLang's mamba state slots.

SGLang keeps a hybrid model's per-request GDN state in the MambaPool of its HybridReqToTokenPool (conv
[slots, conv_dim, W-1] and recurrent [slots, HV, Dv, Dk] per linear layer: atom-kernels' layouts) and builds
the slot of every request in the linear-attention backend's metadata. SGLang always builds its own GDN
backend for these models (inside HybridLinearAttnBackend, beside the selected full-attention backend); this
layer reads that backend's per-forward metadata and translates it into a view of atom-core's gdn_step:
the requests' slots (GDNStepView), or for a chain verify SGLang's speculative scratch (GDNScratchVerify),
from which SGLang's worker commits the accepted state.
"""

from __future__ import annotations

import torch
from sglang.srt.model_executor.forward_context import get_attn_backend
from torch import nn

from atom_core.integration import (
    GDNLayerSpec,
    GDNScratchVerify,
    GDNStates,
    GDNStepView,
    current_forward_context,
    gdn_step,
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
        states = GDNStates(cache.conv[0], state)
        if mode.is_target_verify():
            view = self._verify_view(fb, cache, slots)
        elif mode.is_decode():
            view = GDNStepView(meta.query_start_loc[: bs + 1], slots, None, 1)
        elif mode.is_extend() and not mode.is_draft_extend_v2():
            started = fb.extend_prefix_lens[:bs] > 0
            view = GDNStepView(meta.query_start_loc[: bs + 1], slots, started, max(fb.extend_seq_lens_cpu))
        else:
            raise NotImplementedError(
                f"ATOM's GDN layers under SGLang run EXTEND, MIXED, DECODE and chain TARGET_VERIFY batches, "
                f"not {mode.name}"
            )
        return gdn_step(self.spec, mixed, b, a, conv_weight, A_log, dt_bias, states, view)

    @staticmethod
    def _verify_view(fb, cache, slots) -> GDNScratchVerify:
        """Chain verify: n drafted tokens per request; the state after every token goes to SGLang's
        speculative scratch (intermediate_ssm / intermediate_conv_window, row = the request's batch row)."""
        spec_info = fb.spec_info
        if getattr(spec_info, "topk", 1) != 1:
            raise NotImplementedError(
                f"ATOM's GDN layers verify chain drafts only (speculative topk 1), got topk {spec_info.topk}"
            )
        scratch = GDNStates(cache.intermediate_conv_window[0], cache.intermediate_ssm)
        return GDNScratchVerify(slots, spec_info.draft_token_num, scratch)


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
