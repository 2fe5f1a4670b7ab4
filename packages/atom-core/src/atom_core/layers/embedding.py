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


class SharedVocab(nn.Module):
    """A target's embedding and head as an engine hands them to the target's draft: this rank's rows of each
    (the target's VocabParallelEmbedding / ParallelLMHead weights, shared storage, nothing copied). It is
    what a draft's bind_target takes: embed_input_ids and compute_logits with the target's vocab split."""

    def __init__(self, embed: torch.Tensor, head: torch.Tensor, vocab_size: int, parallel: ParallelConfig):
        super().__init__()
        rows = -(-vocab_size // parallel.tp_size)
        for name, weight in (("embed", embed), ("head", head)):
            if weight.dim() != 2 or weight.shape[0] != rows:
                raise ValueError(
                    f"the shared {name} must hold this rank's {rows} of {vocab_size} vocabulary rows "
                    f"(tp {parallel.tp_rank}/{parallel.tp_size}), got {tuple(weight.shape)}"
                )
        with torch.device("meta"):  # no storage of their own: the target's weights are bound below
            self.embed_tokens = VocabParallelEmbedding(
                vocab_size, embed.shape[1], dtype=embed.dtype, parallel=parallel
            )
            self.lm_head = ParallelLMHead(vocab_size, head.shape[1], dtype=head.dtype, parallel=parallel)
        self.embed_tokens.weight = _shared(embed)
        self.lm_head.weight = _shared(head)

    @classmethod
    def of_modules(cls, embed_tokens: nn.Module, lm_head: nn.Module) -> SharedVocab:
        """The target's own embedding and head modules (atom-core's VocabParallelEmbedding and
        ParallelLMHead, as an engine hands them to the draft): their weights and vocab split."""
        if not isinstance(embed_tokens, VocabParallelEmbedding) or not isinstance(lm_head, ParallelLMHead):
            raise TypeError(
                "a draft shares its ATOM target's VocabParallelEmbedding and ParallelLMHead, got "
                f"{type(embed_tokens).__name__} and {type(lm_head).__name__}"
            )
        return cls(embed_tokens.weight, lm_head.weight, lm_head.vocab_size, lm_head.parallel)

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [T] -> [T, H]."""
        return self.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [T, H] -> [T, vocab_size]."""
        return self.lm_head.logits(hidden)


def _shared(weight: torch.Tensor) -> nn.Parameter:
    return weight if isinstance(weight, nn.Parameter) else nn.Parameter(weight, requires_grad=False)
