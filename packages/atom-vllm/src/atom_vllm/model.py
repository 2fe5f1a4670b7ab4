"""The model class vLLM instantiates for every architecture ATOM supports: an atom-core model inside
vLLM's model contract, built with the adapter's attention backend and vLLM's tensor-parallel group."""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn
from vllm.compilation.decorators import support_torch_compile
from vllm.distributed import get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size
from vllm.distributed.parallel_state import get_tp_group

from atom_core.integration import atom_module_prefix, build_for_engine, load_atom_weights
from atom_vllm.attention.layer import CoreAttentionBackend
from atom_vllm.quantization import checkpoint_config

logger = logging.getLogger("vllm.atom_vllm")


def build_atom(vllm_config, prefix: str, draft_of: str | None = None, state_dtype: str = "float32"):
    """The atom-core model (or, with draft_of, the MTP draft of that target) for vLLM's config, with the
    adapter's attention backend and vLLM's tensor-parallel group, at `<prefix>.atom`; state_dtype: the
    recurrent state dtype of GDN layers (what vLLM allocates for them). -> (model, config)."""
    tp_size = get_tensor_model_parallel_world_size()
    return build_for_engine(
        checkpoint_config(vllm_config.model_config.hf_config.to_dict()),
        attention_backend=CoreAttentionBackend(vllm_config.cache_config),
        dtype=vllm_config.model_config.dtype,
        device=vllm_config.device_config.device,
        tp_size=tp_size,
        tp_rank=get_tensor_model_parallel_rank(),
        tp_group=get_tp_group().device_group if tp_size > 1 else None,
        prefix=atom_module_prefix(prefix),
        draft_of=draft_of,
        state_dtype=state_dtype,
    )


def _compiles(vllm_config) -> bool:
    """vLLM compiles ATOM's models on one rank: atom-core's tensor-parallel all-reduces are plain
    torch.distributed calls, not vLLM's collective ops, and multi-rank tracing is untested; with tensor
    parallelism the model runs eagerly."""
    return vllm_config.parallel_config.tensor_parallel_size == 1


# input_ids / inputs_embeds [T(, hidden)], positions [T] or M-RoPE's [3, T]: T is the traced graph's one
# dynamic size. Kernel choices by T live inside atom_kernels' opaque ops and ATOM's attention ops.
@support_torch_compile(
    dynamic_arg_dims={"input_ids": 0, "positions": -1, "inputs_embeds": 0}, enable_if=_compiles
)
class AtomForCausalLM(nn.Module):
    """vLLM's text-generation model contract over an atom-core model (any architecture in its registry).
    Under vLLM's compilation config its forward is traced and compiled like vLLM's own models'."""

    def __init__(self, *, vllm_config, prefix: str = "", state_dtype: str = "float32"):
        super().__init__()
        hf_config = vllm_config.model_config.hf_config
        self.atom, config = build_atom(vllm_config, prefix, state_dtype=state_dtype)
        self.config = hf_config
        logger.info(
            "ATOM model %s.%s runs %s (tp %d/%d, attention backend ATOM)",
            type(self.atom).__module__,
            type(self.atom).__name__,
            config.architecture,
            get_tensor_model_parallel_rank(),
            get_tensor_model_parallel_world_size(),
        )

    @property
    def model(self) -> nn.Module:
        """The decoder stack (embed_tokens, layers, norm), where vLLM's speculative proposer finds the
        embedding it shares with a draft."""
        return self.atom.model

    @property
    def lm_head(self) -> nn.Module:
        """The head vLLM's proposer shares with an MTP draft."""
        return self.atom.lm_head

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.atom.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor | None,
        positions: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """input_ids: [T]; positions: [T], or [3, T] for M-RoPE models -> hidden states [T, hidden]. No
        pipeline parallelism."""
        if intermediate_tensors is not None:
            raise NotImplementedError("ATOM models under vLLM do not support pipeline parallelism")
        return self.atom(input_ids, positions, inputs_embeds=inputs_embeds)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """[T, hidden] -> [T, vocab] (gathered over tensor-parallel ranks)."""
        return self.atom.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint (name, tensor) pairs -> the names of this module's parameters that were filled."""
        return load_atom_weights(self.atom, weights)
