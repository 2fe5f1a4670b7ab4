"""MoE routers re-drawn for benchmarks: dummy weights send every token to the same few experts, so a
step's speed would follow whichever tokens it produced.

Dummy biases do the same from elsewhere: every token gets the same bias vectors (attention projections',
experts', routers'), and over the layers their sum outweighs what tells tokens apart, so greedy decoding
falls onto a few tokens and every row routes alike. A tiny GPT-OSS with dummy weights on the CPU (12
layers, 64 experts, 16 rows) kept 2-3 distinct tokens and 6-15 distinct experts a decode step with them;
with them zeroed, 16 tokens and 39-45 experts (uniform routing reaches 41). Zeroed biases are still read
and added: the step's work is unchanged."""

from __future__ import annotations

import torch

from atom_core.engine import LLM


def redraw_routers(named_parameters, hidden: int) -> None:
    """Router rows ~ N(0, 1/hidden) on normed inputs (per-token logits of unit spread), no correction
    bias and no bias anywhere (dummy biases are the same for every token: see above), for the modules
    named_parameters yields (an engine's model or a transformers model)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    for name, param in named_parameters:
        if name.endswith(("gate.e_score_correction_bias", "bias")):
            param.data.zero_()
        elif name.endswith("mlp.gate.weight"):
            param.data.normal_(0.0, hidden**-0.5, generator=gen)


def redraw_llm_routers(llm: LLM, hidden: int) -> None:
    """redraw_routers for an LLM's model and its draft, if it has one (a no-op for dense models)."""
    runner = llm.engine.runner
    for model in (runner.model, runner.draft):
        if model is not None:
            redraw_routers(model.named_parameters(), hidden)
