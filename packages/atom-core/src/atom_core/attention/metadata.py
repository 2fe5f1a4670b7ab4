"""Paged-attention metadata for one forward of the native backend."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from atom_core.host_copy import host_to_device, to_device


@dataclass(slots=True)
class PagedAttentionMetadata:
    cu_seqlens_q: torch.Tensor  # [B+1] int32: the new tokens of each sequence, back to back
    seq_lens: torch.Tensor  # [B] int32: tokens in the cache after this forward's writes
    block_tables: torch.Tensor  # [B, max_pages] int32
    slot_mapping: torch.Tensor  # [T] int64: cache slot of each new token (-1: padding)
    max_query_len: int
    max_seq_len: int
    # Set by a caller that knows every sequence adds exactly this many tokens (speculative verify's chain);
    # plain decode (one token each) is recognized without it.
    uniform_query_len: int | None = None
    # Every sequence's tokens are all new (nothing cached before them): MLA may attend on up-projected K/V
    # instead of the latent cache. False is always safe.
    prefill_only: bool = False

    @property
    def decode_query_len(self) -> int | None:
        """Tokens each sequence adds when all add the same few (the decode kernel's case), else None."""
        if self.uniform_query_len is not None:
            return self.uniform_query_len
        return 1 if self.max_query_len == 1 and self.slot_mapping.numel() == self.seq_lens.numel() else None

    @classmethod
    def build(
        cls,
        *,
        query_lens: Sequence[int],
        seq_lens: Sequence[int],
        block_tables: Sequence[Sequence[int]],
        block_size: int,
        device: torch.device | str = "cpu",
    ) -> PagedAttentionMetadata:
        """From host lists: each sequence's new tokens are its last query_lens[b] of seq_lens[b]."""
        if not (len(query_lens) == len(seq_lens) == len(block_tables)):
            raise ValueError("query_lens, seq_lens and block_tables must have one entry per sequence")
        for q_len, s_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
            if not 0 < q_len <= s_len or len(table) * block_size < s_len:
                raise ValueError(
                    f"sequence with {q_len} new of {s_len} tokens and {len(table)} blocks is invalid"
                )
        slots = cache_slots(query_lens, seq_lens, block_tables, block_size)
        width = max(len(t) for t in block_tables)
        tables = torch.tensor([list(t) + [0] * (width - len(t)) for t in block_tables], dtype=torch.int32)
        cu = torch.zeros(len(query_lens) + 1, dtype=torch.int32)
        cu[1:] = torch.tensor(list(query_lens)).cumsum(0)
        return cls(
            cu_seqlens_q=host_to_device(cu, device),
            seq_lens=to_device(list(seq_lens), torch.int32, device),
            block_tables=host_to_device(tables, device),
            slot_mapping=to_device(slots, torch.int64, device),
            max_query_len=max(query_lens),
            max_seq_len=max(seq_lens),
            prefill_only=list(query_lens) == list(seq_lens),
        )


def cache_slots(
    query_lens: Sequence[int], seq_lens: Sequence[int], block_tables: Sequence[Sequence[int]], block_size: int
) -> list[int]:
    """The cache slot of each new token, sequence by sequence: a sequence's new tokens are the last
    query_lens[b] of its seq_lens[b], and position p lies in block block_tables[b][p // block_size]."""
    slots: list[int] = []
    for q_len, s_len, table in zip(query_lens, seq_lens, block_tables, strict=True):
        slots += [table[p // block_size] * block_size + p % block_size for p in range(s_len - q_len, s_len)]
    return slots
