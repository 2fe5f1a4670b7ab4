"""The MoE experts' capture-safe path (fixed shapes, no host sync) equals the sparse path it stands in for."""

import pytest
import torch

from atom_core.config import ParallelConfig
from atom_core.layers.moe import SparseMoE


@pytest.mark.parametrize(("experts", "top_k", "tokens"), [(8, 2, 3), (4, 2, 5), (16, 4, 1)])
def test_static_experts_equal_the_sparse_path(experts, top_k, tokens):
    # tokens * top_k < experts gathers the chosen experts' weights; otherwise every expert runs densely.
    torch.manual_seed(experts + tokens)
    moe = SparseMoE(32, 48, experts, top_k, norm_topk_prob=top_k > 2, dtype=torch.float32,
                    parallel=ParallelConfig())  # fmt: skip
    for p in moe.parameters():
        p.data.normal_(0, 0.1)
    x = torch.randn(tokens, 32)
    weights, ids = moe.route(x)
    torch.testing.assert_close(moe._experts_static(x, weights, ids), moe(x), rtol=1e-5, atol=1e-6)
