"""Runs the model for one scheduled batch: builds its inputs and the metadata each cache kind needs (paged:
block tables and slots; state: one state slot per sequence), and binds the forward context."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from atom_core.attention import PagedAttentionBackend, PagedAttentionMetadata
from atom_core.build import BuildContext
from atom_core.cache import (
    StateCache,
    StateMetadata,
    allocate_caches,
    bytes_per_block,
    bytes_per_slot,
    collect_cache_specs,
    metadata_kinds,
)
from atom_core.cache.specs import PAGED, STATE
from atom_core.config import ModelConfig, ParallelConfig
from atom_core.engine.async_scheduling import feed_sampled
from atom_core.engine.config import EngineConfig
from atom_core.engine.peer_all_reduce import with_peer_all_reduce
from atom_core.engine.scheduler import ScheduledBatch
from atom_core.forward_context import ForwardContext, bind_forward_context
from atom_core.loader import build_draft, build_model, draft_class_for, load_checkpoint
from atom_kernels.sampling import greedy_tokens
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
    logit_rows: list[int]  # token rows that get logits: a sequence's last known token, then its drafts
    # state layers under speculation: per token of the leading sequences that verify drafts, the state
    # slot that keeps the state after it (their own for the known token, a spare one per draft)
    step_slots: list[int] = field(default_factory=list)
    # state slot copies (source, destination): snapshots restored before the forward, kept after it
    state_copies: list[tuple[int, int]] = field(default_factory=list)
    state_saves: list[tuple[int, int]] = field(default_factory=list)
    # async scheduling: keep the argmax of this step's logits on the device (ModelRunner.sampled) for the
    # next step, whose token rows fed_rows take it from rows fed_from (their ids here are placeholders)
    sample_on_device: bool = False
    fed_rows: list[int] = field(default_factory=list)
    fed_from: list[int] = field(default_factory=list)


@dataclass(slots=True)
class DraftInputs:
    """One forward of the speculative draft. Row r reads hidden state hidden_rows[r] of the target's last
    forward (from="target") or of the draft's last logits rows (from="draft": chained drafting)."""

    ids: list[int]
    positions: list[int]
    query_lens: list[int]
    seq_lens: list[int]
    block_tables: list[list[int]]
    hidden_rows: list[int]
    source: str  # "target" or "draft"
    logit_rows: list[int]


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
        # small all-reduces over peer memory where the GPUs allow (collective: every rank is here now)
        self.parallel = parallel = with_peer_all_reduce(
            parallel, device, enabled=not engine.disable_custom_all_reduce
        )
        backend = PagedAttentionBackend(layout=self.cache.layout, kernel_backend=engine.kernel_backend)
        if engine.speculative_config is not None:
            draft_class_for(model_config)  # refuse before loading a target that could not be speculated with
        self.model = build_model(
            model_config,
            BuildContext(backend, parallel=parallel, device=device, state_dtype=engine.state_cache_dtype),
        )
        load_checkpoint(self.model, model_config.path, load_format=engine.load_format)
        self.cache_specs = collect_cache_specs(self.model)
        self.kinds = metadata_kinds(self.cache_specs)
        # The speculative draft (MTP layers): its caches share the target's block tables, so each block
        # holds the target's and the draft's rows of the same tokens.
        self.draft, self.draft_specs = None, []
        if engine.speculative_config is not None:
            self.draft = build_draft(
                model_config,
                BuildContext(backend, parallel=parallel, device=device, state_dtype=engine.state_cache_dtype),
                self.model,
            )
            load_checkpoint(self.draft, model_config.path, load_format=engine.load_format)
            self.draft_specs = collect_cache_specs(self.draft)
            if metadata_kinds(self.draft_specs) != {PAGED}:
                raise NotImplementedError(
                    f"{model_config.architecture}'s draft has {sorted(metadata_kinds(self.draft_specs))} "
                    "caches: speculative decoding supports drafts with paged caches only"
                )
        self.hidden: torch.Tensor | None = None  # the last target forward's hidden states (for the draft)
        self.sampled: torch.Tensor | None = None  # [R] int64 argmax of the last step that asked for it
        self.greedy: torch.Tensor | None = None  # [2, R] int64: sampled, and 1 where the row was finite
        self.kernel_backend = engine.kernel_backend
        self.draft_hidden: torch.Tensor | None = None  # the draft's at its last logits rows (for chaining)
        # A running sequence holds a state slot (and one more per draft under speculation): as many as
        # sequences may run at once.
        spec = engine.speculative_config
        self.state_slots_per_seq = 1 + (spec.num_speculative_tokens if spec is not None else 0)
        self.num_state_slots = engine.max_num_seqs * self.state_slots_per_seq if STATE in self.kinds else 0
        # and snapshot slots after them: states kept at block boundaries for prefix caching
        snapshots = engine.max_num_seqs if engine.state_snapshots is None else engine.state_snapshots
        self.num_state_snapshots = snapshots if STATE in self.kinds else 0
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
            num_slots=self.num_state_slots + self.num_state_snapshots,
            device=device,
        )
        self.draft_caches = allocate_caches(
            self.draft_specs,
            self.cache,
            dtype=model_config.dtype,
            num_blocks=self.num_blocks,
            num_slots=0,
            device=device,
        )
        self.graphs = self.verify_graphs = None
        self.draft_graphs: list = []  # the draft's: one token a sequence (chaining), 1 + k (catching up)
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
                if self.draft is not None:  # the target's verify of k drafts per sequence, and the draft's
                    q = 1 + engine.speculative_config.num_speculative_tokens
                    shape = dict(
                        max_batch=engine.max_num_seqs,
                        device=device,
                        max_model_len=max_model_len,
                        block_size=self.cache.block_size,
                    )
                    self.verify_graphs = DecodeGraphs(
                        self.model, self.caches, self.kinds, query_len=q, **shape
                    )
                    hidden = (model_config.hidden_size, model_config.dtype)
                    self.draft_graphs = [
                        DecodeGraphs(
                            self.draft, self.draft_caches, {PAGED}, query_len=n, hidden_input=hidden, **shape
                        )
                        for n in (1, q)
                    ]

    def shutdown(self) -> None:
        """Release the CUDA graphs (a tensor-parallel rank must, before its NCCL group is destroyed)."""
        for graphs in (self.graphs, self.verify_graphs, *self.draft_graphs):
            if graphs is not None:
                graphs.release()
        self.graphs = self.verify_graphs = None
        self.draft_graphs = []

    def _blocks_that_fit(self, fraction: float) -> int:
        per_block = bytes_per_block(
            [*self.cache_specs, *self.draft_specs], self.cache, dtype=self.config.dtype, device=self.device
        )
        if self.device.type == "cuda":
            free, _ = torch.cuda.mem_get_info(self.device)
            available = int(free * fraction)
        else:
            available = CPU_KV_BYTES
        slots = self.num_state_slots + self.num_state_snapshots
        available -= slots * bytes_per_slot(self.cache_specs, dtype=self.config.dtype)
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
        inputs = StepInputs([], [], [], [], [], [], [], [], [], [])
        drafts = batch.drafts or [[]] * len(batch.seqs)
        for row, (seq, n, draft) in enumerate(zip(batch.seqs, batch.num_new_tokens, drafts, strict=True)):
            start, known = seq.num_computed_tokens, n - len(draft)
            ids = seq.token_ids[start : start + known]  # short by the tokens still on the device
            inputs.ids += ids + [0] * (known - len(ids)) + draft
            inputs.positions += range(start, start + n)
            inputs.query_lens.append(n)
            inputs.seq_lens.append(start + n)
            inputs.block_tables.append(list(seq.block_table))
            inputs.state_slots.append(seq.state_slot)
            inputs.fresh.append(start == 0)
            if draft and seq.state_slot >= 0:
                inputs.step_slots += [seq.state_slot, *seq.spare_state_slots][:n]
            if start + known == seq.num_tokens:
                inputs.ends.append(row)
                last = len(inputs.ids) - len(draft) - 1
                inputs.logit_rows += range(last, last + len(draft) + 1)
        inputs.state_copies = [(snapshot, seq.state_slot) for seq, snapshot in batch.restores]
        inputs.state_saves = [(seq.state_slot, snapshot) for seq, _, snapshot in batch.saves]
        return inputs

    def _copy_states(self, pairs: list[tuple[int, int]]) -> None:
        """Copy every state layer's rows source -> destination (snapshots in and out of running slots)."""
        if not pairs:
            return
        src, dst = (torch.tensor(x, dtype=torch.long, device=self.device) for x in zip(*pairs, strict=True))
        for cache in self.caches:
            if isinstance(cache, StateCache):
                for tensor in cache.states.values():
                    tensor[dst] = tensor[src]

    @torch.inference_mode()
    def run(self, inputs: StepInputs) -> torch.Tensor:
        """The forward for one step; returns logits [len(inputs.ends), V] (on every tensor-parallel rank)."""
        self._copy_states(inputs.state_copies)
        if inputs.fed_rows and self.sampled is None:
            raise RuntimeError("a step feeds on the last step's sampled tokens, but none were kept")
        logits = self._forward(inputs)
        self._copy_states(inputs.state_saves)
        if inputs.sample_on_device:  # argmax and finiteness in one launch (atom-kernels' greedy_tokens)
            self.greedy = greedy_tokens(logits, backend=self.kernel_backend)
            self.sampled = self.greedy[0]
        return logits

    def _forward(self, inputs: StepInputs) -> torch.Tensor:
        for graphs in (self.graphs, self.verify_graphs):
            if graphs is not None and graphs.serves(inputs):
                logits = graphs.run(inputs, sampled=self.sampled)
                if self.draft is not None:
                    self.hidden = graphs.hidden
                return logits
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
                slots=inputs.state_slots,
                fresh=inputs.fresh,
                query_lens=inputs.query_lens,
                step_slots=inputs.step_slots,
                device=self.device,
            )
        pos = torch.tensor(inputs.positions, device=self.device)
        ids = torch.tensor(inputs.ids, device=self.device)
        if inputs.fed_rows:
            feed_sampled(ids, inputs.fed_rows, inputs.fed_from, self.sampled)
        with bind_forward_context(ForwardContext(metadata, self.caches)):
            hidden = self.model(ids, pos)
        if self.draft is not None:
            self.hidden = hidden
        return self.model.compute_logits(
            hidden[torch.tensor(inputs.logit_rows, dtype=torch.long, device=self.device)]
        )

    def execute(self, message: StepInputs | DraftInputs) -> torch.Tensor:
        """What a tensor-parallel worker runs for each message from rank 0."""
        return self.run(message) if isinstance(message, StepInputs) else self.run_draft(message)

    @torch.inference_mode()
    def run_draft(self, inputs: DraftInputs) -> torch.Tensor:
        """One forward of the draft over its own caches (same block tables as the target's); returns logits
        [len(inputs.logit_rows), V] and keeps the draft's hidden states at those rows for chaining."""
        source = self.hidden if inputs.source == "target" else self.draft_hidden
        hidden_in = source[torch.tensor(inputs.hidden_rows, dtype=torch.long, device=self.device)]
        for graphs in self.draft_graphs:
            if graphs.serves(inputs):
                logits = graphs.run(inputs, hidden_in)
                self.draft_hidden = graphs.hidden
                return logits
        meta = PagedAttentionMetadata.build(
            query_lens=inputs.query_lens,
            seq_lens=inputs.seq_lens,
            block_tables=inputs.block_tables,
            block_size=self.cache.block_size,
            device=self.device,
        )
        pos = torch.tensor(inputs.positions, device=self.device)
        with bind_forward_context(ForwardContext({PAGED: meta}, self.draft_caches)):
            hidden = self.draft(torch.tensor(inputs.ids, device=self.device), pos, hidden_in)
        self.draft_hidden = hidden[torch.tensor(inputs.logit_rows, dtype=torch.long, device=self.device)]
        return self.draft.compute_logits(self.draft_hidden)
