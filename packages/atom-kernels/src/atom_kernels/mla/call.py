"""One absorbed-MLA call's inputs, gathered by mla_attention after its checks and read by the torch
reference (ref.py), so the reference sees exactly what the kernel was given."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class MlaCall:
    """q [T, Hq, R + P] against the paged latent cache [N, B, R + P] (fp8 e4m3 with scale [1] fp32, or
    q's dtype with scale None), with cu_seqlens_q [S+1], seq_lens [S] (cached rows, new tokens
    included) and block_tables [S, pages]; R = kv_lora_rank."""

    q: torch.Tensor
    cache: torch.Tensor
    cu_seqlens_q: torch.Tensor
    seq_lens: torch.Tensor
    block_tables: torch.Tensor
    softmax_scale: float
    kv_lora_rank: int = 512
    scale: torch.Tensor | None = None
