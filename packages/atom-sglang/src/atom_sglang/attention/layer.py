"""The atom-core AttentionBackend ATOM models are built with inside SGLang: each attention layer is an
SGLang RadixAttention, so SGLang's KV pool and whichever --attention-backend is selected serve it."""

from __future__ import annotations

import torch
from sglang.srt.layers.radix_attention import RadixAttention

from atom_core.integration import AttentionLayerSpec, current_forward_context
from atom_sglang.runtime import FORWARD_BATCH
from atom_sglang.specs import LAYER_KINDS


class SglangAttentionLayer(RadixAttention):
    """atom-core's AttentionLayer contract on RadixAttention: (q [T, Hq, D], k, v [T, Hkv, D]) -> [T, Hq, D].

    The ForwardBatch comes from the ForwardContext the wrapper binds around its forward.
    """

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        forward_batch = current_forward_context().metadata_for(FORWARD_BATCH)
        t = q.shape[0]
        out = super().forward(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1), forward_batch)
        return out.view(t, self.tp_q_head_num, self.v_head_dim)


class CoreAttentionBackend:
    """atom-core's AttentionBackend protocol under SGLang (given to build_for_engine): one
    SglangAttentionLayer per AttentionLayerSpec.

    layer_ids maps an attention layer's index to its layer id in SGLang's KV pool (identity by default).
    """

    name = "sglang"
    layer_kinds = LAYER_KINDS

    def __init__(self, layer_ids=None):
        self.layer_ids = layer_ids or (lambda index: index)

    def make_layer(self, spec: AttentionLayerSpec) -> SglangAttentionLayer:
        # atom-core's window W sees keys with q - k < W; SGLang's sliding_window_size s sees q - k <= s.
        window = spec.sliding_window - 1 if spec.sliding_window else -1
        return SglangAttentionLayer(
            spec.num_heads,
            spec.head_dim,
            spec.scale,
            num_kv_heads=spec.num_kv_heads,
            layer_id=self.layer_ids(spec.layer_index),
            sliding_window_size=window,
            prefix=spec.prefix,
        )
