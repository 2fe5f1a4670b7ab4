"""Kernel entry points as atom_core exposes them (backend chosen by atom_kernels' rules).

Adapters' attention backends call these; they never import atom_kernels themselves. The ops a model's
forward calls outside its attention layers come from atom_kernels.opaque: eager calls go straight to the
kernels, and under a graph compiler (vLLM's compiled path) each is one opaque op, so the kernel choices
made from shapes stay per call instead of being frozen at the traced size.
"""

from atom_kernels.attention import (
    DecodePartition,
    paged_decode,
    paged_decode_persistent,
    paged_prefill,
    plan_decode,
    varlen_causal_attention,
)
from atom_kernels.cache import KVLayout, kv_cache_shapes, write_kv
from atom_kernels.comm import MAX_ROWS as PEER_NORM_MAX_ROWS
from atom_kernels.comm import all_reduce_rms_norm, fused_buffer_bytes, one_shot_all_reduce
from atom_kernels.comm import pad_slots as peer_pad_slots
from atom_kernels.fp8 import dequantize_weight_ref as dequantize_fp8_weight
from atom_kernels.gdn import (
    ChunkPlan,
    Gating,
    Snapshots,
    causal_conv1d,
    check_gdn_head_sizes,
    gated_delta_rule_chunked,
    gated_delta_rule_recurrent,
    gdn_gating,
    max_key_head_size,
    plan_chunks,
)
from atom_kernels.mla import MAX_ABSORB_TOKENS, absorb_output, absorb_query, mla_attention, write_latent
from atom_kernels.moe import SILU, ExpertActivation, ExpertBiases, ExpertMxfp4, ExpertScales, SharedExpert
from atom_kernels.moe.mxfp4 import E8M0_MAX_BYTE as MXFP4_MAX_SCALE_BYTE
from atom_kernels.moe.mxfp4 import GROUP as MXFP4_GROUP
from atom_kernels.moe.mxfp4 import dequantize_mxfp4, quantize_mxfp4
from atom_kernels.opaque import (
    apply_mrope,
    apply_rotary,
    fp8_linear,
    fused_experts,
    grouped_topk,
    linear,
    rms_norm,
    rms_norm_gated,
    silu_and_mul,
    topk_softmax,
)

__all__ = [
    "MAX_ABSORB_TOKENS",
    "MXFP4_GROUP",
    "MXFP4_MAX_SCALE_BYTE",
    "PEER_NORM_MAX_ROWS",
    "SILU",
    "ChunkPlan",
    "DecodePartition",
    "ExpertActivation",
    "ExpertBiases",
    "ExpertMxfp4",
    "ExpertScales",
    "Gating",
    "KVLayout",
    "SharedExpert",
    "Snapshots",
    "absorb_output",
    "absorb_query",
    "all_reduce_rms_norm",
    "apply_mrope",
    "apply_rotary",
    "causal_conv1d",
    "check_gdn_head_sizes",
    "dequantize_fp8_weight",
    "dequantize_mxfp4",
    "fp8_linear",
    "fused_buffer_bytes",
    "fused_experts",
    "gated_delta_rule_chunked",
    "gated_delta_rule_recurrent",
    "gdn_gating",
    "grouped_topk",
    "kv_cache_shapes",
    "linear",
    "max_key_head_size",
    "mla_attention",
    "one_shot_all_reduce",
    "paged_decode",
    "paged_decode_persistent",
    "paged_prefill",
    "peer_pad_slots",
    "plan_chunks",
    "plan_decode",
    "quantize_mxfp4",
    "rms_norm",
    "rms_norm_gated",
    "silu_and_mul",
    "topk_softmax",
    "varlen_causal_attention",
    "write_kv",
    "write_latent",
]
