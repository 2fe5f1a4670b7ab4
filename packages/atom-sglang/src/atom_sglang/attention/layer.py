"""The atom-core AttentionBackend ATOM models are built with inside SGLang: each attention layer is an
SGLang RadixAttention, so SGLang's KV pool and whichever --attention-backend is selected serve it."""

from __future__ import annotations

import torch
from sglang.srt.layers.radix_attention import RadixAttention

from atom_core.integration import (
    LAYER_KINDS,
    AttentionLayerSpec,
    GDNLayerSpec,
    MLALayerSpec,
    current_forward_context,
)
from atom_sglang.attention.gdn import SglangGDNLayer
from atom_sglang.runtime import FORWARD_BATCH


class SglangAttentionLayer(RadixAttention):
    """atom-core's AttentionLayer contract on RadixAttention: (q [T, Hq, D], k, v [T, Hkv, D]) -> [T, Hq, D].

    The ForwardBatch comes from the ForwardContext the wrapper binds around its forward.
    """

    # the layer's spec: its sinks ([Hq] learned sink logits, GPT-OSS) go to the backend at each call (a
    # plain attribute, so the frontend's parameter is not registered twice)
    spec: AttentionLayerSpec | None = None

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        forward_batch = current_forward_context().metadata_for(FORWARD_BATCH)
        t = q.shape[0]
        sinks = None if self.spec is None else self.spec.sinks
        extra = {} if sinks is None else {"sinks": sinks}  # as SGLang's own GPT-OSS passes them
        out = super().forward(q.reshape(t, -1), k.reshape(t, -1), v.reshape(t, -1), forward_batch, **extra)
        return out.view(t, self.tp_q_head_num, self.v_head_dim)


class SglangMLALayer(RadixAttention):
    """atom-core's MLALayer contract on RadixAttention: (q [T, H, R + P] absorbed, kv_c [T, R] normed latent,
    k_pe [T, P] rotated) -> [T, H, R]. The latent is handed over as SGLang's DeepSeek does on most backends
    (q and k as [latent | rope], v = the latent), which every SGLang MLA backend accepts; the selected
    backend writes it into SGLang's latent pool. Absorbed always: SGLang's un-absorbed prefill is a
    second attention layer of its own DeepSeek's."""

    def __init__(self, spec: MLALayerSpec, layer_id: int):
        super().__init__(
            spec.num_heads,
            spec.kv_lora_rank + spec.rope_dim,
            spec.scale,
            num_kv_heads=1,
            layer_id=layer_id,
            v_head_dim=spec.kv_lora_rank,
            prefix=spec.prefix,
        )

    def forward(self, q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor) -> torch.Tensor:
        forward_batch = current_forward_context().metadata_for(FORWARD_BATCH)
        t = q.shape[0]
        k = torch.cat([kv_c, k_pe], dim=-1)
        out = super().forward(q.reshape(t, -1), k, kv_c, forward_batch)
        return out.view(t, self.tp_q_head_num, self.v_head_dim)

    def wants_unabsorbed(self) -> bool:
        return False

    def unabsorbed(self, *args):  # never asked for: wants_unabsorbed() is False
        raise NotImplementedError("ATOM's MLA under SGLang runs absorbed only")


class CoreAttentionBackend:
    """atom-core's AttentionBackend protocol under SGLang (given to build_for_engine): one
    SglangAttentionLayer per AttentionLayerSpec, one SglangMLALayer per MLALayerSpec, one SglangGDNLayer per
    GDNLayerSpec.

    layer_ids maps an attention layer's index to its layer id in SGLang's KV pool (identity by default).
    """

    name = "sglang"
    layer_kinds = LAYER_KINDS

    def __init__(self, layer_ids=None):
        self.layer_ids = layer_ids or (lambda index: index)

    def make_layer(self, spec: AttentionLayerSpec) -> SglangAttentionLayer:
        # atom-core's window W sees keys with q - k < W; SGLang's sliding_window_size s sees q - k <= s.
        window = spec.sliding_window - 1 if spec.sliding_window else -1
        layer = SglangAttentionLayer(
            spec.num_heads,
            spec.head_dim,
            spec.scale,
            num_kv_heads=spec.num_kv_heads,
            layer_id=self.layer_ids(spec.layer_index),
            sliding_window_size=window,
            prefix=spec.prefix,
        )
        layer.spec = spec
        return layer

    def make_mla_layer(self, spec: MLALayerSpec) -> SglangMLALayer:
        return SglangMLALayer(spec, self.layer_ids(spec.layer_index))

    def make_gdn_layer(self, spec: GDNLayerSpec) -> SglangGDNLayer:
        return SglangGDNLayer(spec, self.layer_ids(spec.layer_index))
