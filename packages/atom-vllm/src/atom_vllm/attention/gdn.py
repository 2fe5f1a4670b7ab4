"""ATOM's Gated DeltaNet under vLLM: a mamba-type layer of the adapter's own over vLLM's state cache (the
"ATOM_GDN" backend, gdn_backend.py, builds its metadata).

The layer translates vLLM's GDNAttentionMetadata into views of atom-core's gdn_step: requests without
drafts continue from their first state block (GDNStepView), requests verifying drafts use vLLM's per-draft
blocks and conv buffer of W - 1 + num_spec inputs (GDNBlockVerify, which describes that layout). Nothing
in vLLM is patched.
"""

from __future__ import annotations

import torch
from torch import nn
from vllm.config import get_current_vllm_config
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.abstract import MambaBase
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first
from vllm.v1.attention.backend import AttentionBackend
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadata
from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum

from atom_core.integration import GDNBlockVerify, GDNLayerSpec, GDNStates, GDNStepView, gdn_step
from atom_vllm.attention.gdn_backend import GDN_BACKEND_NAME, AtomGDNBackend, state_layout
from atom_vllm.attention.opaque import GDN_OP, gdn_attention_op, register_opaque_layer


class VllmGDNLayer(nn.Module, MambaBase):
    """atom-core's GDNLayer contract over vLLM's state cache: (mixed [T, conv_dim], b, a [T, HV], conv
    weight [conv_dim, W], A_log, dt_bias [HV]) -> o [T, HV, Dv]."""

    def __init__(self, spec: GDNLayerSpec):
        super().__init__()
        vllm_config = get_current_vllm_config()
        self.spec, self.layer_name = spec, spec.prefix
        self._shapes, self._dtypes = state_layout(vllm_config, spec)
        self.dim_first = is_conv_state_dim_first()
        self.kv_cache = (torch.tensor([]), torch.tensor([]))  # bound by vLLM's runner
        self.attn_backend, self.sliding_window = AtomGDNBackend, None  # what diagnostics report
        register_opaque_layer(vllm_config, self, GDN_OP)

    @property
    def mamba_type(self):
        return MambaAttentionBackendEnum[GDN_BACKEND_NAME]

    def get_state_shape(self):
        return self._shapes

    def get_state_dtype(self) -> tuple[torch.dtype, torch.dtype]:
        return self._dtypes

    def get_attn_backend(self) -> type[AttentionBackend]:
        return AtomGDNBackend

    def _states(self) -> GDNStates:
        """The conv buffers as [blocks, conv_dim, W - 1 + num_spec] (a view, whatever vLLM's orientation)
        and the recurrent states."""
        conv = self.kv_cache[0]
        return GDNStates(conv if self.dim_first else conv.transpose(1, 2), self.kv_cache[1])

    def _metadata(self) -> GDNAttentionMetadata | None:
        metadata = get_forward_context().attn_metadata
        if metadata is None:
            return None
        if isinstance(metadata, list):
            raise NotImplementedError("ATOM's GDN under vLLM does not run micro-batched (DBO) steps")
        return metadata.get(self.layer_name)

    def forward(self, mixed, b, a, conv_weight, A_log, dt_bias) -> torch.Tensor:
        """One opaque op when vLLM compiles the model (opaque.py)."""
        if torch.compiler.is_compiling():
            return gdn_attention_op(
                mixed, b, a, conv_weight, A_log, dt_bias, self.spec.head_v_dim, self.layer_name
            )
        return self.run(mixed, b, a, conv_weight, A_log, dt_bias)

    def run(self, mixed, b, a, conv_weight, A_log, dt_bias) -> torch.Tensor:
        """The step (forward's contract): requests without drafts, then those verifying drafts."""
        spec = self.spec
        out = mixed.new_zeros(mixed.shape[0], spec.num_v_heads, spec.head_v_dim)
        meta = self._metadata()
        if meta is None:  # vLLM's profiling and dummy runs
            return out
        n, states = meta.num_actual_tokens, self._states()
        weights = (conv_weight, A_log, dt_bias)
        parts = []  # (token rows, view)
        if meta.spec_sequence_masks is not None:
            count = meta.num_spec_decodes
            verify = GDNBlockVerify(
                meta.spec_query_start_loc[: count + 1],
                meta.spec_state_indices_tensor[:count],
                meta.num_accepted_tokens[:count],
            )
            alone = meta.num_prefills == 0 and meta.num_decodes == 0  # every request verifies
            parts.append((slice(0, n) if alone else meta.spec_token_indx.long(), verify))
            if not alone:
                plain = meta.num_prefill_tokens + meta.num_decode_tokens
                parts.append((meta.non_spec_token_indx.long(), self._plain_view(meta, plain)))
        else:
            parts.append((slice(0, n), self._plain_view(meta, n)))
        for rows, view in parts:
            out[rows] = gdn_step(spec, mixed[rows], b[rows], a[rows], *weights, states, view)
        return out

    @staticmethod
    def _plain_view(meta: GDNAttentionMetadata, tokens: int) -> GDNStepView:
        """Requests without drafts (prefills, chunks, decodes): state block 0 of each. tokens: theirs (a
        bound on the longest request's)."""
        cu = meta.non_spec_query_start_loc
        blocks = meta.non_spec_state_indices_tensor[: cu.numel() - 1]
        started = meta.has_initial_state  # None: every request continues (a decode-only step)
        if started is not None:
            started = started[: blocks.numel()]
        return GDNStepView(cu, blocks, started, 1 if meta.num_prefills == 0 else tokens)
