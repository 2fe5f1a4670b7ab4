"""vLLM's piecewise compilation splits its graph at ATOM's MLA and GDN ops as at its own attention ops:
the layers join vLLM's default split list, and vLLM's own splitter gives each its own piece (the pieces
CUDA graphs leave out). Runs in both vLLM environments (no engine)."""

import pytest
import torch
from vllm.compilation.backends import split_graph
from vllm.config import CompilationConfig, CompilationMode

from atom_vllm.attention.opaque import GDN_OP, MLA_OP, gdn_attention_op, mla_attention_op, split_graph_at


def _piecewise_config(**kwargs) -> CompilationConfig:
    config = CompilationConfig(mode=CompilationMode.VLLM_COMPILE, **kwargs)
    config.set_splitting_ops_for_v1(all2all_backend="allgather_reducescatter")
    return config


def test_atom_ops_join_vllms_default_splits_once():
    config = _piecewise_config()
    assert config.splitting_ops_contain_attention()
    for op in (MLA_OP, GDN_OP, MLA_OP):
        split_graph_at(config, op)
    assert config.splitting_ops.count(MLA_OP) == 1 and config.splitting_ops.count(GDN_OP) == 1
    assert config.splitting_ops_contain_attention()


@pytest.mark.parametrize("explicit", [[], ["vllm::unified_attention_with_output"]])
def test_an_explicit_split_list_without_vllms_attention_ops_is_left_alone(explicit):
    config = _piecewise_config(splitting_ops=list(explicit))
    before = list(config.splitting_ops)
    split_graph_at(config, MLA_OP)
    assert config.splitting_ops == before


def _traced(fn, *args) -> torch.fx.GraphModule:
    """fn's graph with symbolic sizes, traced on fake tensors (the ops' fake implementations: no layer runs)."""
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, tracing_mode="symbolic")(*args)


def _ops_of(gm: torch.fx.GraphModule) -> list[str]:
    return [n.target.name() for n in gm.graph.nodes if isinstance(n.target, torch._ops.OpOverload)]


def test_vllms_splitter_puts_each_atom_layer_in_its_own_piece():
    """Decoder-like trace: projections, ATOM's MLA op, more projections, ATOM's GDN op, a projection."""
    config = _piecewise_config()
    split_graph_at(config, MLA_OP)
    split_graph_at(config, GDN_OP)

    def step(x, w):
        h = x @ w
        q, kv_c, k_pe = h.view(-1, 2, 8), h[:, :6], h[:, 6:8]
        o = mla_attention_op(q, kv_c, k_pe, "layers.0.attn").reshape(-1, 12) @ w[:12, :]
        mixed, b, a = o, o[:, :2], o[:, 2:4]
        o = gdn_attention_op(mixed, b, a, w[:4, :4], w[0, :2], w[1, :2], 3, "layers.1.attn")
        return o.reshape(-1, 6) @ w[:6, :]

    gm = _traced(step, torch.randn(5, 16), torch.randn(16, 16))
    _, pieces = split_graph(gm, config.splitting_ops)
    split = [_ops_of(p.graph) for p in pieces if p.is_splitting_graph]
    assert split == [[MLA_OP], [GDN_OP]]
    assert len([p for p in pieces if not p.is_splitting_graph]) == 3
