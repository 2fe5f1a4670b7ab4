"""Runs the model for one scheduled batch: builds its inputs and the metadata each cache kind needs (paged:
block tables and slots; state: one state slot per sequence), and binds the forward context."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist

from atom_core.attention import PagedAttentionBackend, PagedAttentionMetadata
from atom_core.build import BuildContext
from atom_core.cache import (
    StateMetadata,
    allocate_caches,
    bytes_per_block,
    bytes_per_slot,
    collect_cache_specs,
    metadata_kinds,
)
from atom_core.cache.specs import PAGED, STATE
from atom_core.config import ModelConfig, ParallelConfig
from atom_core.engine.config import EngineConfig
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
    state_slots: list[int]  # each sequence's state slot (-1 where the model has no state layers)
    fresh: list[bool]  # the sequence's first tokens are in this step (its state starts from zero)


class ModelRunner:
    """Builds and loads the model, allocates the caches its layers declare, and runs its forwards."""

    def __init__(
        self,
        model_config: ModelConfig,
        engine: EngineConfig,
        *,
        parallel: ParallelConfig,
        device: torch.device,
        max_model_len: int,
        control_group=None,
    ):
        self.config, self.cache, self.device = model_config, engine.cache_config(), device
        backend = PagedAttentionBackend(layout=self.cache.layout, kernel_backend=engine.kernel_backend)
        self.model = build_model(model_config, BuildContext(backend, parallel=parallel, device=device))
        load_checkpoint(self.model, model_config.path, load_format=engine.load_format)
        self.cache_specs = collect_cache_specs(self.model)
        self.kinds = metadata_kinds(self.cache_specs)
        # A running sequence holds a state slot: as many as sequences may run at once.
        self.num_state_slots = engine.max_num_seqs if STATE in self.kinds else 0
        self.num_blocks = self.cache.num_blocks or self._blocks_that_fit(engine.gpu_memory_utilization)
        if parallel.tp_size > 1:  # every rank must hold the same block count
            agreed = torch.tensor([self.num_blocks])
            dist.all_reduce(agreed, op=dist.ReduceOp.MIN, group=control_group)
            self.num_blocks = int(agreed)
        self.caches = allocate_caches(
            self.cache_specs,
            self.cache,
            dtype=model_config.dtype,
            num_blocks=self.num_blocks,
            num_slots=self.num_state_slots,
            device=device,
        )
        self.graphs = None
        # The torch reference kernels index with host-dependent shapes: graphs need the Triton kernels.
        # Dynamic RoPE rescales by the batch's longest position, read on the host each step.
        triton = resolve_backend(engine.kernel_backend, device) is Backend.TRITON
        dynamic_rope = model_config.rope.rope_type == "dynamic"
        if (
            not engine.enforce_eager and device.type == "cuda" and triton and not dynamic_rope
        ):  # every TP rank
            from atom_core.engine.cuda_graphs import DecodeGraphs

            with torch.inference_mode():
                self.graphs = DecodeGraphs(
                    self.model,
                    self.caches,
                    self.kinds,
                    max_batch=engine.max_num_seqs,
                    device=device,
                    max_model_len=max_model_len,
                    block_size=self.cache.block_size,
                )

    def shutdown(self) -> None:
        """Release the CUDA graphs (a tensor-parallel rank must, before its NCCL group is destroyed)."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None

    def _blocks_that_fit(self, fraction: float) -> int:
        per_block = bytes_per_block(self.cache_specs, self.cache, dtype=self.config.dtype, device=self.device)
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            available = int(free * fraction)
        else:
            available = CPU_KV_BYTES
        available -= self.num_state_slots * bytes_per_slot(self.cache_specs, dtype=self.config.dtype)
        if per_block == 0:  # no paged layers: the block tables address nothing, one block will do
            return 1
        blocks = available // per_block
        if blocks < 1:
            raise RuntimeError(
                f"the KV cache does not fit: one block of {self.cache.block_size} tokens needs {per_block} bytes, "
                f"{available} are available"
            )
        return blocks

    @staticmethod
    def prepare(batch: ScheduledBatch) -> StepInputs:
        inputs = StepInputs([], [], [], [], [], [], [], [])
        for row, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            start = seq.num_computed_tokens
            inputs.ids += seq.token_ids[start : start + n]
            inputs.positions += range(start, start + n)
            inputs.query_lens.append(n)
            inputs.seq_lens.append(start + n)
            inputs.block_tables.append(list(seq.block_table))
            inputs.state_slots.append(seq.state_slot)
            inputs.fresh.append(start == 0)
            if start + n == len(seq.token_ids):
                inputs.ends.append(row)
        return inputs

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        """The forward for one step; returns logits [len(inputs.ends), V] (on every tensor-parallel rank)."""
        batch = len(inputs.query_lens)
        if self.graphs is not None and len(inputs.ids) == batch and self.graphs.size_for(batch) is not None:
            return self.graphs.run(inputs)
        meta = PagedAttentionMetadata.build(
            query_lens=inputs.query_lens,
            seq_lens=inputs.seq_lens,
            block_tables=inputs.block_tables,
            block_size=self.cache.block_size,
            device=self.device,
        )
        metadata = {PAGED: meta}
        if STATE in self.kinds:
            metadata[STATE] = StateMetadata.build(
                slots=inputs.state_slots, fresh=inputs.fresh, query_lens=inputs.query_lens, device=self.device
            )
        pos = torch.tensor(inputs.positions, device=self.device)
        with bind_forward_context(ForwardContext(metadata, self.caches)):
            hidden = self.model(torch.tensor(inputs.ids, device=self.device), pos)
        last = meta.cu_seqlens_q[1:].long() - 1
        return self.model.compute_logits(hidden[last[inputs.ends]])
