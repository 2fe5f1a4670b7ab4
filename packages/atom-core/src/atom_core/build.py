"""What a model is built with: the attention backend to use, the parallel setup, the device, and the
weight format its linears take (set by build_model from the checkpoint's config)."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from atom_core.attention.backend import AttentionBackend
from atom_core.config import ParallelConfig
from atom_core.quantization import QuantConfig


@dataclass(slots=True)
class BuildContext:
    attention_backend: AttentionBackend
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    device: torch.device | str = "cpu"
    quant_config: QuantConfig | None = None
    # state layers' recurrent state (GDN): "float32", as transformers keeps it, or "bfloat16" (half the
    # memory and bytes per decode step; rounded after every step)
    state_dtype: str = "float32"
