"""Whether a dummy-weight MoE keeps its decode rows apart, counted on the CPU: distinct tokens and distinct
experts a decode step, with the dummy biases kept and with them zeroed (harness/routers.py).

  python -m benchmarks run routing_spread

Decode benchmarks floor a batch's step at the experts uniform routing reaches; a dummy model whose rows all
route alike reads fewer and times below that floor. A tiny GPT-OSS (biases on attention, experts and
router; 12 layers, 64 experts, top-4), fp32 dummy weights with the routers redrawn, 16 random prompts
decoded greedily for 24 tokens: per layer, the distinct experts each decode step routes the 16 rows to,
against uniform routing's expectation.
"""

from __future__ import annotations

import collections
import statistics
import tempfile

import torch
import transformers

from atom_core.engine import LLM, SamplingParams
from atom_core.layers import moe
from benchmarks.harness.routers import redraw_llm_routers

ROWS, NEW, EXPERTS, TOP_K = 16, 24, 64, 4


def _config() -> transformers.GptOssConfig:
    return transformers.GptOssConfig(
        vocab_size=4000,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        num_local_experts=EXPERTS,
        num_experts_per_tok=TOP_K,
        sliding_window=16,
        max_position_embeddings=512,
        architectures=["GptOssForCausalLM"],
        torch_dtype="float32",
    )


def _spread(zero_biases: bool) -> dict:
    """Distinct last tokens over the rows, and per decode step the distinct experts (mean over layers)."""
    per_step: dict[str, list[int]] = collections.defaultdict(list)
    route = moe.SparseMoE.route

    def counting_route(self, x, logits=None):
        weights, ids = route(self, x, logits)
        if x.shape[0] == ROWS:  # a decode step of all the rows (prefills come one prompt at a time)
            per_step[self.prefix].append(ids.unique().numel())
        return weights, ids

    config = _config()
    with tempfile.TemporaryDirectory() as path:
        config.save_pretrained(path)
        llm = LLM(path, load_format="dummy", dtype="float32", max_model_len=128, max_num_seqs=ROWS)
        redraw_llm_routers(llm, config.hidden_size, zero_biases=zero_biases)
        gen = torch.Generator().manual_seed(0)
        prompts = [
            {"prompt_token_ids": torch.randint(0, config.vocab_size, (32,), generator=gen).tolist()}
            for _ in range(ROWS)
        ]
        moe.SparseMoE.route = counting_route
        try:
            params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True)
            outs = llm.generate(prompts, params, use_tqdm=False)
        finally:
            moe.SparseMoE.route = route
            llm.shutdown()
    steps = [statistics.mean(step) for step in zip(*per_step.values(), strict=True)]
    return dict(
        distinct_last_tokens=len({o.outputs[0].token_ids[-1] for o in outs}),
        experts_per_step_first=steps[0],
        experts_per_step_last=steps[-1],
        experts_per_step_min=min(steps),
    )


def main() -> dict:
    uniform = EXPERTS * (1 - (1 - TOP_K / EXPERTS) ** ROWS)
    result = dict(rows=ROWS, experts=EXPERTS, top_k=TOP_K, uniform_experts_per_step=uniform)
    for label, zero in (("dummy_biases", False), ("biases_zeroed", True)):
        result[label] = _spread(zero)
        print(label, result[label], flush=True)
    print(f"uniform routing: {uniform:.1f} distinct experts a step")
    return result


if __name__ == "__main__":
    main()
