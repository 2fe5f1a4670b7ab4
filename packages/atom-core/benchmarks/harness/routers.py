"""MoE routers re-drawn for benchmarks: dummy weights send every token to the same few experts, so a
step's speed would follow whichever tokens it produced.

Dummy biases do the same from elsewhere: every token gets the same bias vectors (attention projections',
experts', routers'), and over the layers their sum outweighs what tells tokens apart, so greedy decoding
falls onto a few tokens and every row routes alike (routing_spread.py counts it on the CPU for a tiny
GPT-OSS). Zeroed biases are still read and added: the step's work is unchanged. Every parameter named
*bias goes, a GDN layer's dt_bias too (its gating's kernels run the same on any value)."""

from __future__ import annotations

import torch

from atom_core.engine import LLM


def redraw_routers(named_parameters, hidden: int, *, zero_biases: bool = True) -> None:
    """Router rows ~ N(0, 1/hidden) on normed inputs (per-token logits of unit spread), no correction
    bias and no bias anywhere (dummy biases are the same for every token: see above), for the modules
    named_parameters yields (an engine's model or a transformers model). zero_biases=False keeps the
    dummy biases but the routers' (routing_spread.py's baseline)."""
    generators: dict[torch.device, torch.Generator] = {}
    zeroed = ("gate.e_score_correction_bias", "bias" if zero_biases else "mlp.gate.bias")
    for name, param in named_parameters:
        if name.endswith(zeroed):
            param.data.zero_()
        elif name.endswith("mlp.gate.weight"):
            gen = generators.setdefault(param.device, torch.Generator(device=param.device).manual_seed(0))
            param.data.normal_(0.0, hidden**-0.5, generator=gen)


def redraw_llm_routers(llm: LLM, hidden: int, *, zero_biases: bool = True) -> None:
    """redraw_routers for an LLM's model and its draft, if it has one (for a dense model: its biases
    zeroed, the work unchanged)."""
    runner = llm.engine.runner
    for model in (runner.model, runner.draft):
        if model is not None:
            redraw_routers(model.named_parameters(), hidden, zero_biases=zero_biases)
