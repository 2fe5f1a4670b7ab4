"""What atom-sglang's tests share: tiny configs of every architecture ATOM serves, random checkpoints
(no model hub: built here) and transformers' logits as the reference.

pytest imports test files with --import-mode=importlib, so conftest.py puts this directory on sys.path and
tests import this module as `sglang_support`. The checkpoint_for fixture built on it is in conftest.py.
"""

from pathlib import Path

import torch

from tools.testing_models import (  # noqa: F401 (re-exported)
    DEEPSEEK_V2_TINY,
    DEEPSEEK_V3_TINY,
    decisive_routing,
    random_checkpoint,
)

# The dimensions every architecture's tiny config shares.
TINY = dict(
    vocab_size=300,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    max_position_embeddings=256,
)
# Tiny configs that cover each architecture's variants: GQA, head_dim != hidden / heads, tied embeddings,
# q/k norms (Qwen3), routed experts (Qwen3-MoE) and a shared expert (Qwen2-MoE); DeepSeek's MLA (a 32 + 16
# latent row) with its grouped (V3) and greedy (V2, no q LoRA) routing.
ARCHITECTURES = {
    "LlamaForCausalLM": dict(num_attention_heads=4, num_key_value_heads=2),
    "Qwen3ForCausalLM": dict(
        num_attention_heads=4, num_key_value_heads=2, head_dim=32, tie_word_embeddings=True
    ),
    "Qwen3MoeForCausalLM": dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
    ),
    "Qwen2MoeForCausalLM": dict(
        num_attention_heads=2,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
    ),
    "DeepseekV3ForCausalLM": DEEPSEEK_V3_TINY,
    "DeepseekV2ForCausalLM": DEEPSEEK_V2_TINY,
}


def tiny_config(architecture: str, **overrides):
    """The transformers config of `architecture`'s tiny model (overrides change it, e.g. to add windows)."""
    import transformers

    family = architecture.removesuffix("ForCausalLM")
    return getattr(transformers, f"{family}Config")(**{**TINY, **ARCHITECTURES[architecture], **overrides})


def transformers_logits(checkpoint: Path, tokens: list[int]) -> torch.Tensor:
    """transformers' logits at every position of one sequence, [len(tokens), vocab] (fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]
