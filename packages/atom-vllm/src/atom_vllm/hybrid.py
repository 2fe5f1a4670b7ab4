"""The model class vLLM instantiates for ATOM's hybrid architectures (Gated DeltaNet beside full attention:
Qwen3-Next, Qwen3.5): AtomForCausalLM plus what vLLM asks of a hybrid model before and after building it.

vLLM sizes the hybrid cache from the class (state shapes and dtypes per GDN layer) before the model exists,
so these are class methods over vLLM's config; the GDN layers (attention/gdn.py) declare the same shapes.
Qwen3.5's multimodal checkpoints keep M-RoPE: their positions are [3, T], equal rows for text; images are
refused.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.mamba.mamba_utils import (
    MambaStateCopyFuncCalculator,
    MambaStateShapeCalculator,
)
from vllm.model_executor.models.interfaces import HasInnerState, IsHybrid, SupportsMRoPE

from atom_vllm.attention.gdn_backend import recurrent_state_dtype, vllm_state_dtypes
from atom_vllm.model import AtomForCausalLM


class AtomHybridForCausalLM(AtomForCausalLM, HasInnerState, IsHybrid, SupportsMRoPE):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__(
            vllm_config=vllm_config, prefix=prefix, state_dtype=recurrent_state_dtype(vllm_config)
        )

    @classmethod
    def get_mamba_state_dtype_from_config(cls, vllm_config) -> tuple[torch.dtype, torch.dtype]:
        recurrent_state_dtype(vllm_config)  # refuse a dtype ATOM's GDN ops do not keep, before allocating
        return vllm_state_dtypes(vllm_config)

    @classmethod
    def get_mamba_state_shape_from_config(cls, vllm_config):
        text = vllm_config.model_config.hf_text_config
        speculative = vllm_config.speculative_config
        return MambaStateShapeCalculator.gated_delta_net_state_shape(
            vllm_config.parallel_config.tensor_parallel_size,
            text.linear_num_key_heads,
            text.linear_num_value_heads,
            text.linear_key_head_dim,
            text.linear_value_head_dim,
            text.linear_conv_kernel_dim,
            speculative.num_speculative_tokens if speculative is not None else 0,
        )

    @classmethod
    def get_mamba_state_copy_func(cls):
        return MambaStateCopyFuncCalculator.gated_delta_net_state_copy_func()

    def get_mrope_input_positions(
        self, input_tokens: list[int], mm_features: list
    ) -> tuple[torch.Tensor, int]:
        """Text positions as M-RoPE's [3, T] (three equal rows) and no offset for later tokens."""
        if mm_features:
            raise NotImplementedError(
                f"ATOM serves {self.config.architectures[0]} for text only under vLLM; the prompt has "
                f"{len(mm_features)} image/video input(s)"
            )
        positions = torch.arange(len(input_tokens), dtype=torch.long)
        return positions.unsqueeze(0).expand(3, -1), 0
