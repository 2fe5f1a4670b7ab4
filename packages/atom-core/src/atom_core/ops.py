"""Kernel entry points as atom_core exposes them (backend chosen by atom_kernels' rules).

Adapters' attention backends call these; they never import atom_kernels themselves.
"""

from atom_kernels import (
    apply_mrope,
    apply_rotary,
    fused_experts,
    grouped_topk,
    rms_norm,
    rms_norm_gated,
    silu_and_mul,
    topk_softmax,
)
from atom_kernels.attention import (
    DecodePartition,
    paged_decode,
    paged_decode_persistent,
    paged_prefill,
    plan_decode,
    varlen_causal_attention,
)
from atom_kernels.cache import KVLayout, kv_cache_shapes, write_kv
from atom_kernels.fp8 import dequantize_weight_ref as dequantize_fp8_weight
from atom_kernels.fp8 import fp8_linear
from atom_kernels.gdn import causal_conv1d, gated_delta_rule_chunked, gated_delta_rule_recurrent, gdn_gating
from atom_kernels.linear import linear
from atom_kernels.mla import mla_attention, write_latent
from atom_kernels.moe import ExpertScales

__all__ = [
    "DecodePartition",
    "ExpertScales",
    "KVLayout",
    "apply_mrope",
    "apply_rotary",
    "causal_conv1d",
    "dequantize_fp8_weight",
    "fp8_linear",
    "fused_experts",
    "gated_delta_rule_chunked",
    "gated_delta_rule_recurrent",
    "gdn_gating",
    "grouped_topk",
    "kv_cache_shapes",
    "linear",
    "mla_attention",
    "paged_decode",
    "paged_decode_persistent",
    "paged_prefill",
    "plan_decode",
    "rms_norm",
    "rms_norm_gated",
    "silu_and_mul",
    "topk_softmax",
    "varlen_causal_attention",
    "write_kv",
    "write_latent",
]
