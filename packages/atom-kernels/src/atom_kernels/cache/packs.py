"""Argument packs of the KV-cache writers (write.py, write_shuffle.py, write_shuffle_e4m3.py).

Triton passes a tuple argument as its fields, each specialized as a plain argument would be (see
attention/packs.py), so the three writers take the step's new rows and their destination as two packs,
built once by write_kv, instead of fourteen positional parameters each.
"""

from __future__ import annotations

from typing import NamedTuple

import torch


class NewRows(NamedTuple):
    """A step's new keys and values [T, Hkv, D] (last dim contiguous) with their token and head strides."""

    k: torch.Tensor
    v: torch.Tensor
    tokens: int
    stride_kt: int
    stride_kh: int
    stride_vt: int
    stride_vh: int


def new_rows(k: torch.Tensor, v: torch.Tensor) -> NewRows:
    return NewRows(k, v, k.shape[0], k.stride(0), k.stride(1), v.stride(0), v.stride(1))


class CacheSlots(NamedTuple):
    """Where the rows go: the paged caches, each token's slot ([T], block * block_size + offset; -1:
    padding), the fp8 scales (one fp32 value, or [N, Hkv, block_size]; unread placeholders for a bf16/fp16
    cache) and the geometry shared by both caches."""

    k_cache: torch.Tensor
    v_cache: torch.Tensor
    slots: torch.Tensor
    k_scale: torch.Tensor
    v_scale: torch.Tensor
    num_heads: int
    block_size: int
