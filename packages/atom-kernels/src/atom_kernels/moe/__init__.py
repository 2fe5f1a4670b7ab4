"""Fused MoE: routing (softmax top-k, DeepSeek-V3 grouped top-k), token ordering by expert, and the
experts as two grouped GEMMs (gate/up fused with SiLU-and-mul, down with the routing weight) and a combine.
"""

from atom_kernels.moe.align import ExpertOrder, order_by_expert
from atom_kernels.moe.expert_gemm import TileConfig, tile_config
from atom_kernels.moe.expert_mlp import SILU, ExpertActivation, ExpertBiases
from atom_kernels.moe.fused import ExpertScales, fused_experts
from atom_kernels.moe.grouping import GroupedRouting
from atom_kernels.moe.mxfp4 import ExpertMxfp4, dequantize_mxfp4, quantize_mxfp4
from atom_kernels.moe.routing import grouped_topk, topk_softmax
from atom_kernels.moe.shared import SharedExpert

__all__ = [
    "SILU",
    "ExpertActivation",
    "ExpertBiases",
    "ExpertMxfp4",
    "ExpertOrder",
    "ExpertScales",
    "GroupedRouting",
    "SharedExpert",
    "TileConfig",
    "dequantize_mxfp4",
    "fused_experts",
    "grouped_topk",
    "order_by_expert",
    "quantize_mxfp4",
    "tile_config",
    "topk_softmax",
]
