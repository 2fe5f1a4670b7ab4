"""ATOM's MLA and GDN layers as opaque custom ops on vLLM's compiled path, and the graph splits at them.

Why: each layer reads the step's metadata from vLLM's forward context and decides on the host (request
split, drafts, prefill or decode kernel), which a graph traced once must not freeze; and vLLM's piecewise
CUDA graphs must leave these layers out as they leave out vLLM's own attention ops. Under tracing the
layer's forward is one `atom_vllm::*` op that finds the layer by name (vLLM's `no_compile_layers`, which
is the static forward context the layers register in); called eagerly it runs the layer directly.
"""

from __future__ import annotations

import torch
from vllm.forward_context import get_forward_context

MLA_OP = "atom_vllm::mla_attention"
GDN_OP = "atom_vllm::gdn_attention"


def _layer(name: str):
    return get_forward_context().no_compile_layers[name]


@torch.library.custom_op(MLA_OP, mutates_args=())
def mla_attention_op(
    q: torch.Tensor, kv_c: torch.Tensor, k_pe: torch.Tensor, layer_name: str
) -> torch.Tensor:
    """VllmMLALayer.run of the named layer: q [T, H, R + P], kv_c [T, R], k_pe [T, P] -> [T, H, R]."""
    return _layer(layer_name).run(q, kv_c, k_pe)


@mla_attention_op.register_fake
def _(q, kv_c, k_pe, layer_name):
    return q.new_empty((q.shape[0], q.shape[1], kv_c.shape[-1]))


@torch.library.custom_op(GDN_OP, mutates_args=())
def gdn_attention_op(
    mixed: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    conv_weight: torch.Tensor,
    A_log: torch.Tensor,
    dt_bias: torch.Tensor,
    head_v_dim: int,
    layer_name: str,
) -> torch.Tensor:
    """VllmGDNLayer.run of the named layer: mixed [T, conv_dim], b, a [T, HV] -> o [T, HV, head_v_dim]."""
    return _layer(layer_name).run(mixed, b, a, conv_weight, A_log, dt_bias)


@gdn_attention_op.register_fake
def _(mixed, b, a, conv_weight, A_log, dt_bias, head_v_dim, layer_name):
    return mixed.new_empty((mixed.shape[0], b.shape[1], head_v_dim))


def split_graph_at(compilation_config, op: str) -> None:
    """Add op to the ops vLLM's piecewise compilation splits its graph at, where vLLM splits at its own
    attention ops (its default): piecewise CUDA graphs then leave the layer out, as they leave vLLM's
    attention out. An explicit split list without vLLM's attention ops (one chosen for fusion, or none)
    is left as the user set it."""
    ops = compilation_config.splitting_ops
    if ops and compilation_config.splitting_ops_contain_attention() and op not in ops:
        ops.append(op)


def register_opaque_layer(vllm_config, layer, op: str) -> None:
    """Put layer in vLLM's static forward context under its layer_name (where vLLM's runner binds its cache
    and the op finds it) and split the compiled graph at op."""
    context = vllm_config.compilation_config.static_forward_context
    if layer.layer_name in context:
        raise ValueError(f"duplicate layer name {layer.layer_name!r} in vLLM's forward context")
    context[layer.layer_name] = layer
    split_graph_at(vllm_config.compilation_config, op)
