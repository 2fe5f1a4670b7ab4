"""What atom-core's tests share: tiny configs, random checkpoints, transformers' greedy reference, free ports.

pytest imports test files with --import-mode=importlib, so conftest.py puts this directory on sys.path and
tests import this module as `core_support`; worker processes a test spawns inherit that sys.path.
The fixtures built on these (tiny_llama, hf_greedy_tokens, a_free_port) are in conftest.py.
"""

import torch
from torch import nn

from atom_core.cache import StateCacheSpec
from tools.testing_models import free_port, random_checkpoint  # noqa: F401 (re-exported)

# A tiny Llama-shaped config, the base the tests' own configs override (fp32 on the CPU in seconds).
TINY = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
# The model behind the tiny_llama fixture (engine, server and CLI tests).
TINY_LLAMA = dict(TINY, vocab_size=151)

# Tiny DeepSeek-V3 and V2 (MLA + DeepSeek MoE): every path transformers implements is a variant of these.
YARN = dict(rope_type="yarn", rope_theta=10000.0, factor=4.0, original_max_position_embeddings=64)
DSV3 = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=24,
    max_position_embeddings=256,
    rope_interleave=True,
    rope_parameters=dict(YARN, beta_fast=32, beta_slow=1, mscale=0.9, mscale_all_dim=0.7),
    tie_word_embeddings=False,
    bos_token_id=0,
    eos_token_id=1,
)
DSV2 = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=96,
    moe_intermediate_size=32,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=2,
    n_routed_experts=8,
    num_experts_per_tok=3,
    first_k_dense_replace=1,
    routed_scaling_factor=1.5,
    kv_lora_rank=32,
    q_lora_rank=None,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=24,
    max_position_embeddings=256,
    norm_topk_prob=False,
    rope_parameters=dict(YARN, mscale=0.707, mscale_all_dim=0.707),
    tie_word_embeddings=False,
)


def deepseek_checkpoint(path, config_cls, base: dict, overrides: dict):
    """A random tiny model whose routing is decisive (no near-ties between implementations) and whose
    e_score_correction_bias is not zero, saved as transformers saves it."""
    torch.manual_seed(0)
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(config_cls(**{**base, **overrides})).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0, 0.5)
                if hasattr(layer.mlp.gate, "e_score_correction_bias"):
                    layer.mlp.gate.e_score_correction_bias.uniform_(-0.3, 0.3)
    model.save_pretrained(path)
    return model


def hf_greedy(model, prompt, steps):
    """Plain argmax decoding with transformers' own KV cache (no logits processors: generate() would, e.g.,
    suppress EOS under min_new_tokens)."""
    tokens, past = list(prompt), None
    with torch.no_grad():
        step_input = torch.tensor([prompt])
        for _ in range(steps):
            out = model(step_input, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
            step_input = torch.tensor([[tokens[-1]]])
    return tokens[len(prompt) :]


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
