"""Qwen3: Llama's structure with RMSNorm over each head of q and k (and an explicit head_dim)."""

from atom_core.models.attention_windows import qwen3_windows
from atom_core.models.llama import LlamaForCausalLM


class Qwen3ForCausalLM(LlamaForCausalLM):
    qk_norm = True
    attention_windows = staticmethod(qwen3_windows)

    def mlp_bias(self, config) -> bool:
        return False
