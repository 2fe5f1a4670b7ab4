"""Engine-side helpers: draining finished outputs, and a state layer that counts the tokens it sees."""

import torch
from torch import nn

from atom_core.cache import StateCacheSpec


def drain_finished(engine) -> dict:
    """Step an engine until it has nothing left; its finished outputs by request id."""
    finished = {}
    while engine.has_unfinished_requests():
        finished.update({out.request_id: out for out in engine.step() if out.finished})
    return finished


class TokenCounter(nn.Module):
    """A state layer, as a GDN layer is one: per sequence, the count and sum of the tokens it has seen, kept in
    its state slot. Each forward counts rows whose resumed state does not cover exactly the positions before
    their chunk, or whose `fresh` flag disagrees with starting at position 0 (`problems`). Tensor ops only, so
    decode steps replay it in CUDA graphs."""

    SPEC = StateCacheSpec((("seen", (2,), torch.float64),))

    def __init__(self, cache_index: int):
        super().__init__()
        self.cache_index = cache_index
        self.cache_spec = self.SPEC
        self.problems = self.fresh_starts = self.resumed = None  # [] int64 on the model's device

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor) -> None:
        from atom_core.forward_context import current_forward_context

        ctx = current_forward_context()
        meta, state = ctx.metadata_for("state"), ctx.caches[self.cache_index].states["seen"]
        if self.problems is None:
            self.problems, self.fresh_starts, self.resumed = torch.zeros(
                3, dtype=torch.int64, device=state.device
            )
        cu = meta.cu_seqlens_q.long()
        start = positions[cu[:-1]]
        sums = torch.cat([input_ids.new_zeros(1), input_ids.cumsum(0)]).to(torch.float64)
        seen = torch.stack([(cu[1:] - cu[:-1]).to(torch.float64), sums[cu[1:]] - sums[cu[:-1]]], dim=1)
        valid, fresh = meta.slots >= 0, meta.fresh
        rows = meta.slots.long().clamp(min=0)  # padding rows (-1) change nothing below
        before = state[rows] * (~fresh)[:, None]
        wrong = (before[:, 0] != start) | (fresh != (start == 0))
        self.problems.add_((wrong & valid).sum())
        self.fresh_starts.add_((fresh & valid).sum())
        self.resumed.add_((~fresh & valid).sum())
        state.index_add_(0, rows, torch.where(valid[:, None], before + seen - state[rows], 0))


def install_token_counter(monkeypatch) -> list[TokenCounter]:
    """Every Llama-family model built from now on gets a TokenCounter after its decoder layers (the last cache
    index) that sees every forward's tokens; returns the list the built counters are appended to."""
    from atom_core.models.llama import LlamaForCausalLM

    init, forward, counters = LlamaForCausalLM.__init__, LlamaForCausalLM.forward, []

    def counted_init(self, config, ctx, prefix=""):
        init(self, config, ctx, prefix)
        self.counter = TokenCounter(cache_index=len(self.model.layers))
        counters.append(self.counter)

    def counted_forward(self, input_ids, positions, inputs_embeds=None):
        self.counter(input_ids, positions)
        return forward(self, input_ids, positions, inputs_embeds)

    monkeypatch.setattr(LlamaForCausalLM, "__init__", counted_init)
    monkeypatch.setattr(LlamaForCausalLM, "forward", counted_forward)
    return counters


def greedy_under_pressure(path, hf, hf_greedy_tokens, prompts: list[list[int]], steps: int = 12):
    """The engine over a tiny KV cache (4-token blocks, 14 of them, 16 tokens a step) on prompts sharing a
    prefix: each greedy answer must be transformers', and the run must have chunked a prefill, preempted a
    sequence and hit the prefix cache (so all three crossed whatever the model does to its cache)."""
    from atom_core import LLM, SamplingParams

    greedy = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True)
    llm = LLM(path, kernel_backend="torch", block_size=4, num_kv_blocks=14, max_num_batched_tokens=16)
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], greedy)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy_tokens(hf, prompt, steps)
    assert llm.engine.scheduler.num_chunked_prefills > 0
    assert llm.engine.scheduler.num_preemptions > 0
    assert llm.engine.blocks.num_prefix_hits > 0
