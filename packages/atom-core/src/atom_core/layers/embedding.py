"""Token embedding and LM head, with the vocabulary split over tensor-parallel ranks."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from atom_core.config import ParallelConfig
from atom_core.layers.parallel import all_gather_last_dim, all_reduce
from atom_core.ops import linear


class VocabParallelEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden: int, *, dtype, parallel: ParallelConfig):
        super().__init__()
        self.parallel = parallel
        self.vocab_size = vocab_size
        self.rows = -(-vocab_size // parallel.tp_size)  # this rank's rows (the last rank is padded)
        self.start = parallel.tp_rank * self.rows
        self.weight = nn.Parameter(torch.zeros(self.rows, hidden, dtype=dtype), requires_grad=False)
        self.weight.weight_loader = self.weight_loader

    def weight_loader(self, param, loaded, shard_id=None):
        if tuple(loaded.shape) != (self.vocab_size, param.shape[1]):
            raise ValueError(f"expected shape {(self.vocab_size, param.shape[1])}, got {tuple(loaded.shape)}")
        part = loaded[self.start : self.start + self.rows]
        param.data[: part.shape[0]].copy_(part)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if self.parallel.tp_size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        mine = (local >= 0) & (local < self.rows)
        out = F.embedding(local.clamp(0, self.rows - 1), self.weight) * mine[:, None]
        return all_reduce(out, self.parallel)


class ParallelLMHead(VocabParallelEmbedding):
    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [T, H] -> [T, vocab_size]."""
        return all_gather_last_dim(linear(hidden, self.weight), self.parallel)[:, : self.vocab_size]
