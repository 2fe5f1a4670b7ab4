"""Runs the model for one scheduled batch: builds inputs and paged metadata, binds the forward context."""

from __future__ import annotations

import torch

from atom_core.attention import PagedAttentionBackend, PagedAttentionMetadata, allocate_kv_caches
from atom_core.attention.kv_cache import kv_bytes_per_block
from atom_core.build import BuildContext
from atom_core.config import CacheConfig, ModelConfig, ParallelConfig
from atom_core.engine.scheduler import ScheduledBatch
from atom_core.forward_context import ForwardContext, bind_forward_context
from atom_core.loader import build_model, load_checkpoint

CPU_KV_BYTES = 1 << 30  # the KV cache's share of host memory when none is given


class ModelRunner:
    def __init__(self, model_config: ModelConfig, cache: CacheConfig, *, parallel: ParallelConfig,
                 device: torch.device, load_format: str, kernel_backend: str | None,
                 memory_fraction: float = 0.9):  # fmt: skip
        self.config, self.cache, self.device = model_config, cache, device
        backend = PagedAttentionBackend(layout=cache.layout, kernel_backend=kernel_backend)
        self.model = build_model(model_config, BuildContext(backend, parallel=parallel, device=device))
        load_checkpoint(self.model, model_config.path, load_format=load_format)
        self.num_kv_heads = self.model.model.layers[0].self_attn.num_kv_heads
        self.num_blocks = cache.num_blocks or self._blocks_that_fit(memory_fraction)
        self.kv_caches = allocate_kv_caches(model_config, cache, num_blocks=self.num_blocks,
                                            num_kv_heads=self.num_kv_heads, device=device)  # fmt: skip

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

    @torch.inference_mode()
    def execute(self, batch: ScheduledBatch) -> tuple[list[int], torch.Tensor]:
        """Compute the batch's new tokens; returns (rows of batch.seqs that reached their end, their logits)."""
        ids, positions, q_lens, s_lens, tables, ends = [], [], [], [], [], []
        for row, (seq, n) in enumerate(zip(batch.seqs, batch.num_new_tokens, strict=True)):
            start = seq.num_computed_tokens
            ids += seq.token_ids[start : start + n]
            positions += range(start, start + n)
            q_lens.append(n)
            s_lens.append(start + n)
            tables.append(seq.block_table)
            if start + n == len(seq.token_ids):
                ends.append(row)
        meta = PagedAttentionMetadata.build(query_lens=q_lens, seq_lens=s_lens, block_tables=tables,
                                            block_size=self.cache.block_size, device=self.device)  # fmt: skip
        pos = torch.tensor(positions, device=self.device)
        with bind_forward_context(ForwardContext(pos, meta, self.kv_caches)):
            hidden = self.model(torch.tensor(ids, device=self.device), pos)
        last = meta.cu_seqlens_q[1:].long() - 1
        return ends, self.model.compute_logits(hidden[last[ends]])
