"""Gated DeltaNet's stateful part through the backend seam, and the native engine's layer for it.

The frontend (layers/gdn.py) projects q|k|v, the output gate and b, a, and normalizes and projects the
output. A backend's GDN layer runs what reads and writes per-sequence state: the depthwise causal conv
continuing from the conv state (then the spec's activation: SiLU in every
checkpoint), the gating, and the gated delta rule over the recurrent
state. The native engine keeps both states in its state slots (StateMetadata); an adapter keeps them
where its engine allocates them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from atom_core.attention.gdn_step import GDNStates, GDNStepView, chunked_form, gdn_step
from atom_core.cache.allocate import StateCache
from atom_core.cache.metadata import StateMetadata
from atom_core.cache.specs import STATE, StateCacheSpec
from atom_core.forward_context import current_forward_context

CONV_ACTIVATIONS = ("silu", None)


@dataclass(frozen=True, slots=True)
class GDNLayerSpec:
    layer_index: int  # its cache index
    num_k_heads: int  # key heads on this rank
    num_v_heads: int  # value heads on this rank (a multiple of num_k_heads)
    head_k_dim: int
    head_v_dim: int
    conv_width: int  # the depthwise conv's kernel size (linear_conv_kernel_dim)
    state_dtype: torch.dtype  # the recurrent state's (the conv state is in the model's dtype)
    prefix: str  # the module path, e.g. "model.layers.0.linear_attn.core"
    conv_activation: str | None = "silu"  # after the conv: the config's hidden_act, or None (identity)

    def __post_init__(self) -> None:
        if self.conv_activation not in CONV_ACTIVATIONS:
            raise ValueError(
                f"{self.prefix}: the GDN conv's activation must be one of {CONV_ACTIVATIONS}, "
                f"got {self.conv_activation!r}"
            )

    @property
    def conv_silu(self) -> bool:
        """Whether SiLU follows the conv (the argument atom-kernels' causal_conv1d takes)."""
        return self.conv_activation == "silu"

    @property
    def key_dim(self) -> int:
        return self.num_k_heads * self.head_k_dim

    @property
    def value_dim(self) -> int:
        return self.num_v_heads * self.head_v_dim

    @property
    def conv_dim(self) -> int:
        """The conv's channels: q | k | v."""
        return 2 * self.key_dim + self.value_dim

    def cache_spec(self) -> StateCacheSpec:
        """conv: the last conv_width - 1 inputs [conv_dim, W-1]; recurrent: S [HV, Dv, Dk]."""
        return StateCacheSpec(
            (
                ("conv", (self.conv_dim, self.conv_width - 1), None),
                ("recurrent", (self.num_v_heads, self.head_v_dim, self.head_k_dim), self.state_dtype),
            )
        )

    def split_heads(self, mixed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The conv's output [T, conv_dim] -> q, k [T, HK, Dk], v [T, HV, Dv] (views)."""
        tokens = mixed.shape[0]
        q, k, v = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        return (
            q.view(tokens, self.num_k_heads, self.head_k_dim),
            k.view(tokens, self.num_k_heads, self.head_k_dim),
            v.view(tokens, self.num_v_heads, self.head_v_dim),
        )


class GDNLayer(Protocol):
    """What an attention backend's make_gdn_layer returns (the frontend in layers/gdn.py calls it)."""

    def __call__(
        self,
        mixed: torch.Tensor,
        b: torch.Tensor,
        a: torch.Tensor,
        conv_weight: torch.Tensor,
        A_log: torch.Tensor,
        dt_bias: torch.Tensor,
    ) -> torch.Tensor:
        """mixed: q|k|v [T, conv_dim] before the conv; b, a: [T, HV]; conv_weight [conv_dim, W]; A_log,
        dt_bias [HV] -> o [T, HV, Dv], each sequence continuing from its states and updating them."""
        ...


class GDNSlotLayer:
    """The native engine's GDN layer: states in the engine's per-sequence slots. A verify step's sequences
    keep the state after every token (StateMetadata.step_slots) so the engine commits the accepted one."""

    def __init__(self, spec: GDNLayerSpec):
        self.spec = spec

    def __call__(self, mixed, b, a, conv_weight, A_log, dt_bias) -> torch.Tensor:
        ctx = current_forward_context()
        meta: StateMetadata = ctx.metadata_for(STATE)
        cache: StateCache = ctx.caches[self.spec.layer_index]
        states = GDNStates(cache.states["conv"], cache.states["recurrent"])
        outs = []
        # verifying sequences (state after every token) first, then the others
        for i, j, m in meta.parts(mixed.shape[0]):
            plan = m.chunk_plan(j - i) if chunked_form(m.max_query_len, m.step_slots) else None
            view = GDNStepView(
                m.cu_seqlens_q, m.slots, m.started(), m.max_query_len, m.step_slots, plan, m.snapshots
            )
            outs.append(
                gdn_step(self.spec, mixed[i:j], b[i:j], a[i:j], conv_weight, A_log, dt_bias, states, view)
            )
        return outs[0] if len(outs) == 1 else torch.cat(outs)
