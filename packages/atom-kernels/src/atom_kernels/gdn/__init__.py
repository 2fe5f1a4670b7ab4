"""Gated delta net (Qwen3-Next, Qwen3.5 linear attention): gating, causal conv1d with state slots, and the
gated delta rule as a chunked prefill and a recurrent decode step."""

from atom_kernels.gdn.call import Gating, Snapshots
from atom_kernels.gdn.chunked import GdnTiles, gated_delta_rule_chunked, gdn_tiles, plan_chunks
from atom_kernels.gdn.conv1d import causal_conv1d
from atom_kernels.gdn.gating import gdn_gating
from atom_kernels.gdn.inputs import check_gdn_head_sizes, max_key_head_size
from atom_kernels.gdn.packs import ChunkPlan
from atom_kernels.gdn.recurrent import gated_delta_rule_recurrent

__all__ = [
    "ChunkPlan",
    "Gating",
    "GdnTiles",
    "Snapshots",
    "causal_conv1d",
    "check_gdn_head_sizes",
    "gated_delta_rule_chunked",
    "gated_delta_rule_recurrent",
    "gdn_gating",
    "gdn_tiles",
    "max_key_head_size",
    "plan_chunks",
]
