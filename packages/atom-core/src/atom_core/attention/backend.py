"""The seam between attention frontends (model math) and attention backends (where KV lives, which kernels).

A frontend asks its BuildContext's backend for one AttentionLayer per attention layer at build time and
calls it with attention-ready q, k, v. The native engine, the vLLM adapter and the SGLang adapter each
pass their own backend; nothing switches on a global "framework" setting.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import torch

from atom_core.cache.specs import PagedKVSpec

if TYPE_CHECKING:  # (their modules import this one's specs' neighbours: named here for the protocol only)
    from atom_core.attention.gdn import GDNLayer, GDNLayerSpec
    from atom_core.attention.mla import MLALayer, MLALayerSpec

# Every layer kind atom-core's models are built from (the attention backends' layer_kinds name which of
# them a backend builds).
LAYER_KINDS = frozenset({"mha", "sliding", "mla", "gdn"})


@dataclass(frozen=True, slots=True)
class AttentionLayerSpec:
    layer_index: int  # index among the model's attention layers (its cache index)
    num_heads: int  # q heads on this rank
    num_kv_heads: int  # KV heads on this rank
    head_dim: int
    scale: float
    prefix: str  # the module path, e.g. "model.layers.3.self_attn.attn"
    sliding_window: int | None = None
    # learned per-head sink logits [num_heads] fp32 (GPT-OSS): each softmax row gets exp(sink) more in its
    # denominator and no value; the frontend's parameter, read at each call (so loaded after the build)
    sinks: torch.Tensor | None = field(default=None, compare=False)

    def cache_spec(self) -> PagedKVSpec:
        """What this layer keeps per token: K and V of its KV heads (the layer's kind: mha or sliding)."""
        return PagedKVSpec(self.num_kv_heads, self.head_dim, self.sliding_window)


@dataclass(frozen=True, slots=True)
class QKPrologue:
    """What a frontend does to q and k before attention: RMSNorm of each head by q_weight / k_weight [D]
    (+ weight_offset) where the model normalizes them (Qwen3, Qwen3-Next, Qwen3.5; None: Llama), then
    rotary of the first rotary_dim dims (neox pairs; by [3, T] positions when mrope_section is set). A
    backend layer that can fuse it with its KV write offers `attend_with_prologue`."""

    q_weight: torch.Tensor | None
    k_weight: torch.Tensor | None
    eps: float
    weight_offset: float
    inv_freq: torch.Tensor  # [rotary_dim / 2] fp32
    rotary_dim: int
    scaling: float = 1.0
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False


class AttentionLayer(Protocol):
    # Optional: True when q/k/v may be views with a unit last stride (slices of one qkv projection). A layer
    # that leaves it out (as the vLLM and SGLang layers do) gets contiguous tensors.
    accepts_strided_inputs: bool

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """q: [T, Hq, D], k/v: [T, Hkv, D] for this forward's tokens -> [T, Hq, D]. Reads the ForwardContext."""
        ...

    # Optional: attend_with_prologue(q, k, v, prologue: QKPrologue, positions) -> [T, Hq, D], or None when
    # this layer cannot fuse it (the frontend then normalizes and rotates, and calls the layer).


class AttentionBackend(Protocol):
    """What a model's frontends ask of the surface they run on (the native engine, vLLM or SGLang): one
    layer per attention layer of each kind, built once at model build time."""

    name: str
    # The layer kinds (LAYER_KINDS) it can build; a model that needs another one is refused at build time,
    # naming its architecture and the kind.
    layer_kinds: frozenset[str]

    def make_layer(self, spec: AttentionLayerSpec) -> AttentionLayer:
        """Full (or sliding-window) attention over paged KV: kinds "mha" and "sliding"."""
        ...

    def make_mla_layer(self, spec: MLALayerSpec) -> MLALayer:
        """Multi-head latent attention over the latent cache: kind "mla"."""
        ...

    def make_gdn_layer(self, spec: GDNLayerSpec) -> GDNLayer:
        """Gated DeltaNet's conv and recurrent states: kind "gdn"."""
        ...
