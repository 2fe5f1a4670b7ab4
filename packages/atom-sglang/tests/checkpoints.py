"""Random transformers checkpoints of every architecture ATOM serves (no model hub: built here)."""

# Tiny configs that cover each architecture's variants: GQA, head_dim != hidden / heads, tied embeddings,
# q/k norms (Qwen3), routed experts (Qwen3-MoE) and a shared expert (Qwen2-MoE).
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
}
