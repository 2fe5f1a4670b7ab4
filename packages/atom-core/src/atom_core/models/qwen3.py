"""Qwen3: Llama's structure with RMSNorm over each head of q and k (and an explicit head_dim)."""

from atom_core.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
