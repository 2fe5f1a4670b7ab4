"""Linear layers, replicated or split over tensor-parallel ranks, each with a weight loader.

Every linear knows its module path (`prefix`, e.g. "model.layers.3.mlp.down_proj") and holds the weight
method its model's QuantConfig picks for that path (`quant_method`): the method creates, multiplies and
finishes the weights; the layer keeps what is about shape and sharding. A parameter's `weight_loader(param, loaded, shard_id)` copies this rank's slice of a checkpoint tensor;
packed layers (qkv, gate_up) take one shard per checkpoint tensor. Shape problems raise ValueError
saying what was expected; the checkpoint loader adds the tensor's name.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from atom_core.config import ParallelConfig
from atom_core.layers.parallel import RankPartial, all_reduce, may_defer_reduce
from atom_core.quantization import UNQUANTIZED, QuantConfig


def _check(loaded: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(loaded.shape) != tuple(shape):
        raise ValueError(f"expected shape {tuple(shape)}, got {tuple(loaded.shape)}")


def _split(total: int, parallel: ParallelConfig, what: str) -> int:
    if total % parallel.tp_size:
        raise ValueError(f"{what} {total} is not divisible by tensor-parallel size {parallel.tp_size}")
    return total // parallel.tp_size


class RowPiece(NamedTuple):
    """Rows [src, src + size) of a checkpoint tensor land at this rank's rows [dst, dst + size)."""

    dst: int
    src: int
    size: int


class LinearBase(nn.Module):
    """A linear's sharding is data: `row_pieces(shard_id)` says where a checkpoint tensor's rows land and
    `col_range()` which of its columns this rank keeps, so weights, biases and block scales all load
    through one map (the weight method maps scale grids with it)."""

    def __init__(
        self,
        in_local: int,
        out_local: int,
        *,
        bias: bool,
        dtype: torch.dtype,
        parallel: ParallelConfig,
        prefix: str,
        quant_config: QuantConfig | None = None,
    ):
        super().__init__()
        self.parallel, self.prefix = parallel, prefix
        self.in_local, self.out_local = in_local, out_local
        self.quant_method = (quant_config or UNQUANTIZED).linear_method(prefix, self.packed_from())
        self.quant_method.create_weights(self, in_local, out_local, dtype)
        self.bias = None
        if bias:
            self.bias = nn.Parameter(torch.empty(out_local, dtype=dtype), requires_grad=False)
            self.bias.weight_loader = self.weight_loader

    def packed_from(self) -> tuple[str, ...]:
        """The checkpoint modules this one packs (qkv_proj: q_proj, k_proj, v_proj); empty if none."""
        return ()

    def shard_ids(self) -> tuple:
        """The shard ids its checkpoint tensors come with (None: one tensor)."""
        return (None,)

    def row_pieces(self, shard_id=None) -> tuple[int, list[RowPiece]]:
        """(rows of the checkpoint tensor for shard_id, where they land)."""
        return self.out_local, [RowPiece(0, 0, self.out_local)]

    def col_range(self) -> tuple[int, int, int]:
        """(columns of the checkpoint tensor, first column this rank keeps, how many)."""
        return self.in_local, 0, self.in_local

    def weight_loader(self, param: nn.Parameter, loaded: torch.Tensor, shard_id=None) -> None:
        rows, pieces = self.row_pieces(shard_id)
        if getattr(param, "block_scale", False):  # a scale grid: the weight method maps its blocks
            return self.quant_method.load_scale(self, param, loaded, rows, pieces)
        if param.dim() == 1:
            _check(loaded, (rows,))
        else:
            cols, start, size = self.col_range()
            _check(loaded, (rows, cols, *param.shape[2:]))
            loaded = loaded.narrow(1, start, size)
        for piece in pieces:
            param.data.narrow(0, piece.dst, piece.size).copy_(loaded.narrow(0, piece.src, piece.size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.quant_method.apply(self, x, self.bias)


class ReplicatedLinear(LinearBase):
    pass


class ColumnParallelLinear(LinearBase):
    """Output features split over ranks; the output stays split (the next row-parallel layer consumes it)."""

    def __init__(self, in_features: int, out_features: int, *, parallel: ParallelConfig, **kwargs):
        super().__init__(
            in_features, _split(out_features, parallel, "output size"), parallel=parallel, **kwargs
        )

    def row_pieces(self, shard_id=None):
        rows = self.out_local
        return rows * self.parallel.tp_size, [RowPiece(0, self.parallel.tp_rank * rows, rows)]


def _parts_pieces(sizes: list[int], parallel: ParallelConfig, dst: int = 0) -> list[RowPiece]:
    """A rank's slice of every part of a tensor whose rows are `sizes` back to back, placed contiguously."""
    pieces, src = [], 0
    for size in sizes:
        local = _split(size, parallel, "part size")
        pieces.append(RowPiece(dst, src + parallel.tp_rank * local, local))
        dst, src = dst + local, src + size
    return pieces


class MergedColumnParallelLinear(ColumnParallelLinear):
    """Several column-parallel outputs in one matmul (gate and up): shard i is output_sizes[i] wide; one
    tensor holding them all (shard None) gives each part's slice."""

    def __init__(self, in_features: int, output_sizes: list[int], **kwargs):
        self.output_sizes = output_sizes
        super().__init__(in_features, sum(output_sizes), **kwargs)
        for param in self.parameters():
            param.expected_shards = frozenset(range(len(output_sizes)))

    def packed_from(self):
        return ("gate_proj", "up_proj") if self.prefix.endswith(".gate_up_proj") else ()

    def shard_ids(self):
        return tuple(range(len(self.output_sizes)))

    def row_pieces(self, shard_id=None):
        if shard_id is None:
            return sum(self.output_sizes), _parts_pieces(self.output_sizes, self.parallel)
        tp, rank = self.parallel.tp_size, self.parallel.tp_rank
        size = self.output_sizes[shard_id] // tp
        offset = sum(self.output_sizes[:shard_id]) // tp
        return self.output_sizes[shard_id], [RowPiece(offset, rank * size, size)]


def narrow_parts(loaded: torch.Tensor, sizes: list[int], parallel: ParallelConfig) -> torch.Tensor:
    """This rank's rows of a tensor whose rows are parts of `sizes` back to back, each split over ranks."""
    _split(sum(sizes), parallel, "output size")
    if loaded.shape[0] != sum(sizes):
        raise ValueError(f"expected {sum(sizes)} rows ({' + '.join(map(str, sizes))}), got {loaded.shape[0]}")
    pieces = _parts_pieces(sizes, parallel)
    return torch.cat([loaded.narrow(0, p.src, p.size) for p in pieces]) if parallel.tp_size > 1 else loaded


class PartsColumnParallelLinear(ColumnParallelLinear):
    """One checkpoint tensor holding several outputs back to back (GDN's in_proj_qkv: q | k | v), each
    split over ranks: a rank's rows are its slice of every part."""

    def __init__(self, in_features: int, part_sizes: list[int], **kwargs):
        self.part_sizes = part_sizes
        super().__init__(in_features, sum(part_sizes), **kwargs)

    def row_pieces(self, shard_id=None):
        return sum(self.part_sizes), _parts_pieces(self.part_sizes, self.parallel)


class QKVParallelLinear(ColumnParallelLinear):
    """q, k and v projections in one matmul; heads split over ranks (KV heads replicated when fewer than ranks)."""

    def __init__(
        self,
        hidden: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        *,
        parallel: ParallelConfig,
        **kwargs,
    ):
        tp = parallel.tp_size
        self.head_dim = head_dim
        self.num_heads = _split(num_heads, parallel, "num_attention_heads")
        if num_kv_heads >= tp:
            self.num_kv_heads = _split(num_kv_heads, parallel, "num_key_value_heads")
            self.kv_head_start = parallel.tp_rank * self.num_kv_heads
        else:
            if tp % num_kv_heads:
                raise ValueError(
                    f"tensor-parallel size {tp} must be a multiple of num_key_value_heads {num_kv_heads}"
                )
            self.num_kv_heads = 1
            self.kv_head_start = parallel.tp_rank // (tp // num_kv_heads)
        self.total_kv_heads = num_kv_heads
        LinearBase.__init__(
            self, hidden, (self.num_heads + 2 * self.num_kv_heads) * head_dim, parallel=parallel, **kwargs
        )
        for param in self.parameters():
            param.expected_shards = frozenset({"q", "k", "v"})

    def packed_from(self):
        return ("q_proj", "k_proj", "v_proj")

    def shard_ids(self):
        return ("q", "k", "v")

    def row_pieces(self, shard_id=None):
        d, hq, hkv = self.head_dim, self.num_heads, self.num_kv_heads
        if shard_id == "q":
            return hq * self.parallel.tp_size * d, [RowPiece(0, self.parallel.tp_rank * hq * d, hq * d)]
        if shard_id in ("k", "v"):
            dst = (hq + (hkv if shard_id == "v" else 0)) * d
            return self.total_kv_heads * d, [RowPiece(dst, self.kv_head_start * d, hkv * d)]
        raise ValueError(f"qkv shard must be 'q', 'k' or 'v', got {shard_id!r}")


class RowParallelLinear(LinearBase):
    """Input features split over ranks; partial outputs are summed over ranks (then the bias is added once)."""

    def __init__(self, in_features: int, out_features: int, *, parallel: ParallelConfig, **kwargs):
        super().__init__(
            _split(in_features, parallel, "input size"), out_features, parallel=parallel, **kwargs
        )
        # set by the module whose output this is, when a norm follows (defer_output_reduce)
        self.defer_reduce = False

    def col_range(self):
        cols = self.in_local
        return cols * self.parallel.tp_size, self.parallel.tp_rank * cols, cols

    def forward(self, x: torch.Tensor) -> torch.Tensor | RankPartial:
        """x: [T, K_local] -> [T, N], summed over ranks (or left to the next norm: see reduce)."""
        return self.reduce(self.quant_method.apply(self, x))

    def reduce(self, partial: torch.Tensor) -> torch.Tensor | RankPartial:
        """This rank's partial product -> the layer's output: summed over ranks, then the bias added once.
        With defer_reduce (and no bias) the partial itself, as a RankPartial the next norm reduces."""
        if self.defer_reduce and self.bias is None and may_defer_reduce(self.parallel):
            return RankPartial(partial, self.parallel)
        y = all_reduce(partial, self.parallel)
        return y if self.bias is None else y + self.bias
