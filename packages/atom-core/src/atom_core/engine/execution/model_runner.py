"""Runs the model for one scheduled batch: builds and loads it (and its speculative draft), plans and
allocates the caches its layers declare, and runs each step's forward with the metadata every cache kind
needs (paged: block tables and slots; state: one state slot per sequence)."""

from __future__ import annotations

import dataclasses
import functools

import torch

from atom_core.attention import PagedAttentionBackend, PagedAttentionMetadata
from atom_core.build import BuildContext
from atom_core.cache import (
    StateMetadata,
    allocate_caches,
    collect_cache_specs,
    copy_state_rows,
    metadata_kinds,
)
from atom_core.cache.specs import PAGED, STATE
from atom_core.config import ModelConfig, ParallelConfig
from atom_core.engine.config import EngineConfig
from atom_core.engine.execution.ahead_rows import commit_states, lag_behind, move_back
from atom_core.engine.execution.cache_memory import MemoryBudget, blocks_that_fit, release_cached_memory
from atom_core.engine.execution.graph_sets import GraphSets
from atom_core.engine.execution.peer_all_reduce import with_peer_all_reduce
from atom_core.engine.execution.runner import DraftResult, StepResult
from atom_core.engine.execution.step_inputs import DraftInputs, StepInputs, feed_sampled
from atom_core.engine.plan import plan_engine
from atom_core.engine.sampling.prompt_logprobs import score_prompt_rows
from atom_core.engine.sampling.sampler import sample_rows
from atom_core.forward_context import ForwardContext, bind_forward_context
from atom_core.host_copy import row_index, to_device
from atom_core.loader import build_draft, build_model, draft_class_for, load_checkpoint, parameter_bytes
from atom_kernels.sampling import accepted_drafts, greedy_tokens


class ModelRunner:
    """One rank's model, caches and forwards (the Runner protocol, engine/execution/runner.py)."""

    def __init__(
        self,
        model_config: ModelConfig,
        engine: EngineConfig,
        *,
        parallel: ParallelConfig,
        device: torch.device,
        control_group=None,
    ):
        self.config, self.cache, self.device = model_config, engine.cache_config(), device
        self.kernel_backend = engine.kernel_backend
        # small all-reduces over peer memory where the GPUs allow (collective: every rank is here now)
        self.parallel = parallel = with_peer_all_reduce(
            parallel, device, enabled=not engine.disable_custom_all_reduce
        )
        backend = PagedAttentionBackend(layout=self.cache.layout, kernel_backend=engine.kernel_backend)
        context = BuildContext(
            backend, parallel=parallel, device=device, state_dtype=engine.state_cache_dtype
        )
        if engine.speculative_config is not None:
            draft_class_for(model_config)  # refuse before loading a target that could not be speculated with
        # the memory share is asked for before loading; a cache sized by num_kv_blocks asks for none
        budget = (
            None if engine.num_kv_blocks else MemoryBudget.at_start(device, engine.gpu_memory_utilization)
        )
        self.model = build_model(model_config, context)
        load_checkpoint(self.model, model_config.path, load_format=engine.load_format)
        self.cache_specs = collect_cache_specs(self.model)
        self.kinds = metadata_kinds(self.cache_specs)
        # The speculative draft (MTP layers): its caches share the target's block tables, so each block
        # holds the target's and the draft's rows of the same tokens.
        self.draft, self.draft_specs = None, []
        if engine.speculative_config is not None:
            self.draft = build_draft(model_config, context, self.model)
            load_checkpoint(self.draft, model_config.path, load_format=engine.load_format)
            self.draft_specs = collect_cache_specs(self.draft)
            if metadata_kinds(self.draft_specs) != {PAGED}:
                raise NotImplementedError(
                    f"{model_config.architecture}'s draft has {sorted(metadata_kinds(self.draft_specs))} "
                    "caches: speculative decoding supports drafts with paged caches only"
                )
        self.weight_bytes = parameter_bytes(self.model, self.draft)  # (what the startup log reports)

        fit_blocks = functools.partial(
            blocks_that_fit,
            paged_specs=[*self.cache_specs, *self.draft_specs],
            state_specs=self.cache_specs,
            cache=self.cache,
            dtype=model_config.dtype,
            device=device,
            budget=budget,
            group=control_group if parallel.tp_size > 1 else None,
        )
        self.plan = plan = plan_engine(
            engine,
            model_config,
            self.kinds,
            device=device,
            fit_blocks=fit_blocks,
            layer_kinds={spec.layer_kind for spec in self.cache_specs},
        )
        self.caches = allocate_caches(
            self.cache_specs,
            self.cache,
            dtype=model_config.dtype,
            num_blocks=plan.num_blocks,
            num_slots=plan.num_state_slots,
            device=device,
        )
        self.draft_caches = allocate_caches(
            self.draft_specs,
            self.cache,
            dtype=model_config.dtype,
            num_blocks=plan.num_blocks,
            num_slots=0,
            device=device,
        )
        self.graphs: GraphSets | None = None
        if plan.graph_sizes:  # every tensor-parallel rank captures the same graphs
            self.graphs = GraphSets(
                self.model,
                self.caches,
                self.kinds,
                plan,
                device=device,
                draft=self.draft,
                draft_caches=self.draft_caches,
                hidden=(model_config.hidden_size, model_config.dtype),
            )

    def shutdown(self) -> None:
        """Release the CUDA graphs (a tensor-parallel rank must, before its NCCL group is destroyed), then the
        weights and caches, and hand their memory back to the device: a runner shut down takes no more
        steps, and an engine started after it in the same process gets the whole budget."""
        if self.graphs is not None:
            self.graphs.release()
            self.graphs = None
        self.model = self.draft = None
        self.caches, self.draft_caches = [], []
        release_cached_memory(self.device)

    @torch.inference_mode()
    def run(
        self, inputs: StepInputs, fed: torch.Tensor | None = None, behind: StepResult | None = None
    ) -> StepResult:
        """The forward for one step: logits [len(inputs.logit_rows), V] (on every tensor-parallel rank).
        fed: [N] int64, the tokens inputs.fed_rows take; behind: the verify launched before it (Runner.run)."""
        if inputs.fed_rows and fed is None:
            raise RuntimeError(f"a step feeds on tokens ({inputs.fed_source}), but none were given")
        lag = lag_behind(behind, inputs.shift_from) if inputs.shift_from else None
        copy_state_rows(self.caches, inputs.state_copies, self.device)
        logits, hidden, ids = self._forward(inputs, fed, lag)
        copy_state_rows(self.caches, inputs.state_saves, self.device)
        result = StepResult(logits, hidden if self.draft is not None else None)
        if inputs.prompt_rows:  # (on every tensor-parallel rank: the logits are gathered across them)
            result.prompt_logprobs = score_prompt_rows(
                self.model.compute_logits,
                hidden,
                inputs.prompt_rows,
                inputs.prompt_targets,
                inputs.prompt_tops,
            )
        if inputs.sampling is not None:  # sampled on the device, read by the host later (or never)
            row_lag = None  # (greedy rows have no key; a lag is for uniform rows)
            if lag is not None and any(inputs.sampling.temperatures):
                row_lag = lag[:, None].expand(-1, len(inputs.ids) // len(lag)).reshape(-1)
            result.tokens, result.logprobs = sample_rows(
                logits, inputs.sampling, backend=self.kernel_backend, key_lag=row_lag
            )
        if inputs.verify_ahead:
            q = inputs.verify_ahead + 1
            counts = accepted_drafts(result.tokens[0], ids, q, lag, backend=self.kernel_backend)
            result.accepted, result.rejected, result.last_rows, result.chain_shift = counts
            result.shift = lag if lag is not None else torch.zeros_like(result.accepted)
        return result

    def _forward(
        self, inputs: StepInputs, sampled: torch.Tensor | None, lag: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """logits, every row's hidden state, and the rows' input ids (fed ones included)."""
        graphs = self.graphs.for_step(inputs) if self.graphs is not None else None
        if graphs is not None:
            logits = graphs.run(inputs, sampled=sampled, lag=lag)
            return logits, graphs.hidden, graphs.buffers["ids"][: len(inputs.ids)]
        metadata = {PAGED: self._paged_metadata(inputs)}
        if STATE in self.kinds:
            metadata[STATE] = StateMetadata.build(
                slots=inputs.state_slots,
                fresh=inputs.fresh,
                query_lens=inputs.query_lens,
                step_slots=inputs.step_slots,
                snapshot_slots=inputs.snapshot_slots,
                snapshot_lens=inputs.snapshot_lens,
                device=self.device,
            )
        # one copy of the token rows' ids and positions, and one of the logits rows; through pinned memory, as
        # a pageable copy would wait for the step in flight (async scheduling)
        ids, pos = to_device([inputs.ids, inputs.positions], torch.int64, self.device)
        if inputs.fed_rows:
            feed_sampled(ids, inputs.fed_rows, inputs.fed_from, sampled)
        if lag is not None:
            move_back(metadata[PAGED], pos, lag, self.cache.block_size, self.kernel_backend)
            if STATE in metadata:
                commit_states(metadata[STATE].step_slots, metadata[STATE].slots, lag, len(pos) // len(lag))
        with bind_forward_context(ForwardContext(metadata, self.caches)):
            hidden = self.model(ids, pos)
        rows = to_device(inputs.logit_rows, torch.long, self.device)
        return self.model.compute_logits(hidden[rows]), hidden, ids

    def _paged_metadata(self, inputs: StepInputs | DraftInputs) -> PagedAttentionMetadata:
        return PagedAttentionMetadata.build(
            query_lens=inputs.query_lens,
            seq_lens=inputs.seq_lens,
            block_tables=inputs.block_tables,
            block_size=self.cache.block_size,
            device=self.device,
        )

    @torch.inference_mode()
    def run_draft(self, inputs: DraftInputs, source: StepResult | DraftResult) -> DraftResult:
        """One forward of the draft over its own caches (same block tables as the target's), reading
        source's hidden states at inputs.hidden_rows and, at inputs.fed_rows, source's tokens (a draft's
        proposals, or the target step's draws). inputs.ahead: its rows follow a verify launched ahead."""
        # fed rows take the draft's proposals (chained) or the target's draws (a catch-up)
        fed = (
            (source.tokens if isinstance(source, DraftResult) else source.sampled)
            if inputs.fed_rows
            else None
        )
        if inputs.fed_rows and fed is None:
            raise RuntimeError("a draft forward feeds on its source's tokens, but none were kept")
        lag, follows, rows = None, None, None
        if inputs.ahead:
            if isinstance(source, StepResult):  # a catch-up: the verify's own positions
                lag, follows = source.shift, source
            elif source.follows is not None:  # the first chained forward: after the last accepted row
                if inputs.fed_from != inputs.hidden_rows:
                    raise ValueError("a chain launched ahead feeds on the rows it reads the hidden states of")
                lag, rows = source.follows.chain_shift, source.follows.last_rows
                fed = fed[rows]
                inputs = dataclasses.replace(inputs, fed_from=list(range(len(inputs.fed_rows))))
            else:
                lag = source.shift
        if rows is None:  # (a catch-up reads every row of its target step in order: a view)
            rows = row_index(inputs.hidden_rows, self.device, source.hidden.shape[0])
        hidden_in = source.hidden[rows]
        graphs = self.graphs.for_draft(inputs) if self.graphs is not None else None
        if graphs is not None:
            logits = graphs.run(inputs, hidden_in, sampled=fed, lag=lag)
            return DraftResult(logits, graphs.hidden, self._proposals(logits), lag, follows)
        ids, pos = to_device([inputs.ids, inputs.positions], torch.int64, self.device)
        if fed is not None:
            feed_sampled(ids, inputs.fed_rows, inputs.fed_from, fed)
        metadata = self._paged_metadata(inputs)
        if lag is not None:
            move_back(metadata, pos, lag, self.cache.block_size, self.kernel_backend)
        with bind_forward_context(ForwardContext({PAGED: metadata}, self.draft_caches)):
            hidden = self.draft(ids, pos, hidden_in)
        hidden = hidden[to_device(inputs.logit_rows, torch.long, self.device)]
        logits = self.draft.compute_logits(hidden)
        return DraftResult(logits, hidden, self._proposals(logits), lag, follows)

    def _proposals(self, logits: torch.Tensor) -> torch.Tensor:
        """The draft's argmax of each row [R] int64, in one launch (torch's reduction takes several times
        as long over a vocabulary-wide row: it splits a row over few blocks)."""
        return greedy_tokens(logits, backend=self.kernel_backend)[0]
