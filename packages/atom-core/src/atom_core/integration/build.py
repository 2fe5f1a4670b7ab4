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
) -> tuple[nn.Module, ModelConfig]:
    """The (unloaded) ATOM model an engine's HF config dict describes, with the engine's attention backend
    and tensor-parallel group; prefix: the model's module path in the engine's wrapper (e.g. "atom"),
    which its attention layers report as their names. Returns (model, its ModelConfig)."""
    config = ModelConfig.from_hf_dict(hf_config, dtype=dtype)
    parallel = ParallelConfig(tp_size=tp_size, tp_rank=tp_rank, group=tp_group if tp_size > 1 else None)
    ctx = BuildContext(attention_backend=attention_backend, parallel=parallel, device=device)
    return build_model(config, ctx, prefix=f"{prefix}." if prefix else ""), config


def build_draft_for_engine(
    hf_config: dict[str, Any],
    target_architecture: str,
    *,
    attention_backend: AttentionBackend,
    dtype: torch.dtype,
    device: torch.device | str,
    tp_size: int = 1,
    tp_rank: int = 0,
    tp_group: Any = None,
    prefix: str = "",
) -> tuple[nn.Module, ModelConfig]:
    """The (unloaded, unbound) MTP draft of `target_architecture` for an engine's draft HF config dict (an
    engine may rename the architecture, e.g. vLLM's "DeepSeekMTPModel"); bind it to the target's shared
    embedding and head with draft.bind_target before its first forward. Returns (draft, its ModelConfig)."""
    config = ModelConfig.from_hf_dict({**hf_config, "architectures": [target_architecture]}, dtype=dtype)
    parallel = ParallelConfig(tp_size=tp_size, tp_rank=tp_rank, group=tp_group if tp_size > 1 else None)
    ctx = BuildContext(attention_backend=attention_backend, parallel=parallel, device=device)
    return build_draft(config, ctx, None, prefix=f"{prefix}." if prefix else ""), config
