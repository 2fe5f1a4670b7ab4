"""How an engine adapter builds ATOM's model: one function both adapters call, so the steps from an
engine's HF config to a built model (config, parallel setup, build context, module prefix) live once."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from atom_core.attention.backend import AttentionBackend
from atom_core.build import BuildContext
from atom_core.config import ModelConfig, ParallelConfig
from atom_core.loader import build_draft, build_model


def build_for_engine(
    hf_config: dict[str, Any],
    *,
    attention_backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device | str,
    tp_size: int = 1,
    tp_rank: int = 0,
    tp_group: Any = None,
    prefix: str = "",
    draft_of: str | None = None,
    state_dtype: str = "float32",
) -> tuple[nn.Module, ModelConfig]:
    """The (unloaded) ATOM model an engine's HF config dict describes, with the engine's attention backend
    and tensor-parallel group; prefix: the model's module path in the engine's wrapper (e.g. "atom"),
    which its attention layers report as their names. Returns (model, its ModelConfig).

    draft_of: build the MTP draft of that target architecture instead, from the engine's draft config (an
    engine may rename its architecture, e.g. vLLM's "DeepSeekMTPModel"), unbound: bind it to the target's
    shared embedding and head with draft.bind_target before its first forward.

    state_dtype: the recurrent state's dtype in state layers (GDN), "float32" or "bfloat16": what the
    engine allocates for them."""
    if draft_of is not None:
        hf_config = {**hf_config, "architectures": [draft_of]}
    config = ModelConfig.from_hf_dict(hf_config, dtype=dtype)
    parallel = ParallelConfig(tp_size=tp_size, tp_rank=tp_rank, group=tp_group if tp_size > 1 else None)
    ctx = BuildContext(
        attention_backend=attention_backend, parallel=parallel, device=device, state_dtype=state_dtype
    )
    prefix = f"{prefix}." if prefix else ""
    if draft_of is not None:
        return build_draft(config, ctx, None, prefix=prefix), config
    return build_model(config, ctx, prefix=prefix), config
