"""Runs the model for one scheduled batch: builds inputs and paged metadata, binds the forward context."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from atom_core.attention import PagedAttentionBackend, PagedAttentionMetadata, allocate_kv_caches
from atom_core.attention.kv_cache import kv_bytes_per_block
from atom_core.build import BuildContext
from atom_core.config import CacheConfig, ModelConfig, ParallelConfig
from atom_core.engine.scheduler import ScheduledBatch
from atom_core.forward_context import ForwardContext, bind_forward_context
from atom_core.loader import build_model, load_checkpoint
from atom_kernels.settings import Backend, resolve_backend

CPU_KV_BYTES = 1 << 30  # the KV cache's share of host memory when none is given


@dataclass(slots=True)
class StepInputs:
    """One step's model inputs as plain lists: what rank 0 sends to the other tensor-parallel ranks."""

    ids: list[int]
    positions: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    ends: list[int]  # rows whose sequence reaches its last known token: they get logits


class ModelRunner:
    def __init__(
        self,
        model_config: ModelConfig,
        cache: CacheConfig,
        *,
        parallel: ParallelConfig,
        device: torch.device,
        load_format: str,
        kernel_backend: str | None,
        memory_fraction: float = 0.9,
        control_group=None,
        cuda_graphs: bool = False,
        max_num_seqs: int = 256,
        max_model_len: int | None = None,
    ):
        self.config, self.cache, self.device = model_config, cache, device
        backend = PagedAttentionBackend(layout=cache.layout, kernel_backend=kernel_backend)
        self.model = build_model(model_config, BuildContext(backend, parallel=parallel, device=device))
        load_checkpoint(self.model, model_config.path, load_format=load_format)
        self.num_kv_heads = self.model.model.layers[0].self_attn.num_kv_heads
        self.num_blocks = cache.num_blocks or self._blocks_that_fit(memory_fraction)
        if parallel.tp_size > 1:  # every rank must hold the same block count
            agreed = torch.tensor([self.num_blocks])
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=control_group)
            self.num_blocks = int(agreed)
        self.kv_caches = allocate_kv_caches(
            model_config, cache, num_blocks=self.num_blocks, num_kv_heads=self.num_kv_heads, device=device
        )
        self.graphs = None
        # The torch reference kernels index with host-dependent shapes: graphs need the Triton kernels.
        # Dynamic RoPE rescales by the batch's longest position, read on the host each step.
        triton = resolve_backend(kernel_backend, device) is Backend.TRITON
        dynamic_rope = model_config.rope.rope_type == "dynamic"
        if cuda_graphs and device.type == "cuda" and triton and not dynamic_rope:  # every TP rank, in order
            from atom_core.engine.cuda_graphs import DecodeGraphs

            with torch.inference_mode():
                self.graphs = DecodeGraphs(
                    self.model,
                    self.kv_caches,
                    max_batch=max_num_seqs,
                    device=device,
                    max_model_len=max_model_len or model_config.max_position_embeddings,
                    block_size=cache.block_size,
                )

    def shutdown(self) -> None:
        """Release the CUDA graphs (a tensor-parallel rank must, before its NCCL group is destroyed)."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None

    def _blocks_that_fit(self, fraction: float) -> int:
        per_block = kv_bytes_per_block(self.config, self.cache, self.num_kv_heads, self.device)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            available = int(free * fraction)
        else:
            available = CPU_KV_BYTES
        blocks = available // per_block
        if blocks < 1:
            raise RuntimeError(
                f"the KV cache does not fit: one block of {self.cache.block_size} tokens needs {per_block} bytes, "
                f"{available} are available"
            )
        return blocks

    @staticmethod
    def prepare(batch: ScheduledBatch) -> StepInputs:
        inputs = StepInputs([], [], [], [], [], [])
        for row, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            start = seq.num_computed_tokens
            inputs.ids += seq.token_ids[start : start + n]
            inputs.positions += range(start, start + n)
            inputs.query_lens.append(n)
            inputs.seq_lens.append(start + n)
            inputs.block_tables.append(list(seq.block_table))
            if start + n == len(seq.token_ids):
                inputs.ends.append(row)
        return inputs

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        """The forward for one step; returns logits [len(inputs.ends), V] (on every tensor-parallel rank)."""
        batch = len(inputs.query_lens)
        if self.graphs is not None and len(inputs.ids) == batch and self.graphs.size_for(batch) is not None:
            return self.graphs.run(inputs.ids, inputs.positions, inputs.seq_lens, inputs.block_tables)
        meta = PagedAttentionMetadata.build(
            query_lens=inputs.query_lens,
            seq_lens=inputs.seq_lens,
            block_tables=inputs.block_tables,
            block_size=self.cache.block_size,
            device=self.device,
        )
        pos = torch.tensor(inputs.positions, device=self.device)
        with bind_forward_context(ForwardContext(pos, meta, self.kv_caches)):
            hidden = self.model(torch.tensor(inputs.ids, device=self.device), pos)
        last = meta.cu_seqlens_q[1:].long() - 1
        return self.model.compute_logits(hidden[last[inputs.ends]])
