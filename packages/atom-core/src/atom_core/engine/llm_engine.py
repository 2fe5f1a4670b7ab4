"""The engine: requests in, scheduled steps through the model runner, finished outputs out."""

from __future__ import annotations

import functools
import itertools
import logging
from dataclasses import dataclass, field
from pathlib import Path

from atom_core.config import ConfigError, ModelConfig, ParallelConfig
from atom_core.engine.async_scheduling import HostTokens, InFlightStep, sampled_on_device
from atom_core.engine.block_manager import BlockManager
from atom_core.engine.config import EngineConfig
from atom_core.engine.detokenizer import IncrementalDetokenizer
from atom_core.engine.drafting import Drafter
from atom_core.engine.model_runner import ModelRunner, StepInputs
from atom_core.engine.outputs import CompletionOutput, OutputKind, RequestOutput
from atom_core.engine.sampler import NON_FINITE, sample
from atom_core.engine.sampling_params import SamplingParams
from atom_core.engine.scheduler import ScheduledBatch, Scheduler
from atom_core.engine.sequence import Sequence, Status
from atom_core.engine.speculative import verify
from atom_core.engine.state_slots import StateSlots
from atom_core.engine.state_snapshots import StateSnapshots
from atom_core.engine.stop_strings import StopScan
from atom_core.engine.tensor_parallel import TensorParallelRunner

Prompt = str | list[int] | dict
logger = logging.getLogger("atom.engine")


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence] = field(default_factory=list)


class LLMEngine:
    """The native engine for one EngineConfig (LLM(...) builds one from keyword arguments)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        model = config.model
        if model is None:
            from atom_core.demo import ensure_demo_checkpoint

            model = ensure_demo_checkpoint(log=lambda _: None)
        self.model_config = ModelConfig.from_pretrained(model, dtype=config.dtype)
        self.max_model_len = self._check_max_model_len(config.max_model_len)
        self.device = config.torch_device()
        if config.tensor_parallel_size > 1:
            self.runner = TensorParallelRunner(
                self.model_config, config, device=self.device, max_model_len=self.max_model_len
            )
        else:
            self.runner = ModelRunner(
                self.model_config,
                config,
                parallel=ParallelConfig(),
                device=self.device,
                max_model_len=self.max_model_len,
            )
        self.max_model_len = self._fit_max_model_len(
            config.max_model_len, self.runner.num_blocks * config.block_size
        )
        # State layers (GDN) resume a cached prefix from a snapshot of their state at its end: without
        # snapshot slots, no prefix caching for them.
        state = self.runner.num_state_slots > 0
        running, kept = self.runner.num_state_slots, self.runner.num_state_snapshots
        snapshots = StateSnapshots(range(running, running + kept)) if state and kept else None
        self.blocks = BlockManager(
            self.runner.num_blocks,
            config.block_size,
            prefix_caching=not state or snapshots is not None,
            snapshots=snapshots,
        )
        slots = StateSlots(running) if state else None
        spares = self.runner.state_slots_per_seq - 1 if state else 0
        self.scheduler = Scheduler(config.scheduler_config(), self.blocks, slots, spare_state_slots=spares)
        spec = config.speculative_config
        self.drafter = (
            None
            if spec is None
            else Drafter(self.runner, self.blocks, spec.num_speculative_tokens, self.max_model_len)
        )
        self.num_draft_tokens = 0  # speculative tokens verified, over all requests
        self.num_accepted_tokens = 0  # of those, accepted
        self.num_verifications = 0  # sequence-steps that verified drafts
        self.tokenizer = self._load_tokenizer(Path(model))
        self.eos_token_ids = self._eos_ids()
        self.requests: dict[str, _Request] = {}
        self._ids = itertools.count()
        # forwards that failed in a row (a caller may decide the engine is dead)
        self.consecutive_failures = 0
        # async scheduling (engine/async_scheduling.py): greedy decode steps launched before the host reads
        # the last one's tokens; not with a speculative draft or state layers
        self.async_scheduling = (
            config.async_scheduling_on() and self.drafter is None and self.runner.num_state_slots == 0
        )
        self._in_flight: InFlightStep | None = None
        self._host_tokens = HostTokens(config.max_num_seqs, self.device) if self.async_scheduling else None
        self.num_async_steps = 0  # steps launched while the one before was still in flight

    def _check_max_model_len(self, asked: int | None) -> int:
        limit = self.model_config.max_position_embeddings
        if asked is None:
            return limit
        if asked > limit:
            raise ConfigError(f"max_model_len {asked} is above the model's max_position_embeddings {limit}")
        return asked

    def _fit_max_model_len(self, asked: int | None, capacity: int) -> int:
        """One sequence of max_model_len tokens must fit the KV cache, or no request could be promised to
        finish: a length the user set is refused, the model's own limit is lowered (and said so)."""
        if self.max_model_len <= capacity:
            return self.max_model_len
        blocks = f"{self.runner.num_blocks} KV blocks hold {capacity} tokens"
        if asked is not None:
            raise ConfigError(
                f"max_model_len {asked} does not fit the KV cache: {blocks} (give more blocks or "
                "memory, or a smaller max_model_len)"
            )
        logger.warning("max_model_len lowered from %d to %d: %s", self.max_model_len, capacity, blocks)
        return capacity

    @staticmethod
    def _load_tokenizer(path: Path):
        if not any(
            (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
        ):
            return None
        from transformers import AutoTokenizer

        try:  # never run a checkpoint's own code (auto_map): transformers then refuses instead of asking
            return AutoTokenizer.from_pretrained(path, trust_remote_code=False)
        except (OSError, ValueError) as err:
            raise ConfigError(f"{path}: its tokenizer could not be loaded: {err}") from None

    def _eos_ids(self) -> set[int]:
        found = self.model_config.generation.get("eos_token_id", self.model_config.hf.get("eos_token_id"))
        ids = set(found if isinstance(found, list) else [found] if found is not None else [])
        if self.tokenizer is not None and self.tokenizer.eos_token_id is not None:
            ids.add(self.tokenizer.eos_token_id)
        return ids

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        if isinstance(prompt, dict):
            if "prompt_token_ids" in prompt:
                return prompt.get("prompt"), list(prompt["prompt_token_ids"])
            prompt = prompt.get("prompt", "")
        if isinstance(prompt, list):
            return None, list(prompt)
        if self.tokenizer is None:
            raise ValueError("this model has no tokenizer: pass prompts as {'prompt_token_ids': [...]}")
        if len(prompt) > self.max_prompt_chars:  # refused before the tokenizer spends time on it
            raise ValueError(
                f"the prompt has {len(prompt)} characters: more than max_model_len {self.max_model_len} "
                f"tokens of this tokenizer can hold ({self.max_prompt_chars})"
            )
        return prompt, self.tokenizer(prompt).input_ids

    @functools.cached_property
    def max_prompt_chars(self) -> int:
        """No prompt longer than this fits max_model_len tokens: a token covers at most as many characters
        as its longest vocabulary entry (twice that, for normalizers that merge characters)."""
        return 2 * max(map(len, self.tokenizer.get_vocab())) * self.max_model_len

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Validate the whole request, then queue all its samples: a request that raises ValueError
        left nothing behind."""
        params = params or SamplingParams()
        text, ids = self.tokenize(prompt)
        vocab = self.model_config.vocab_size
        if not ids:
            raise ValueError("the prompt is empty")
        if any(isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be integers in [0, {vocab})")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                f"max_model_len {self.max_model_len}"
            )
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = _Request(
            request_id, text, ids, [Sequence(request_id, i, ids, params) for i in range(params.n)]
        )
        for seq in request.seqs:
            self.scheduler.add(seq)
        self.requests[request_id] = request
        return request_id

    def abort(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        for seq in request.seqs if request else []:
            self._end(seq, "abort")

    def fail(self, reasons: dict[str, str]) -> list[RequestOutput]:
        """End these requests ({request id: why}) with an error, their blocks freed; the engine goes on
        with the others."""
        outputs = []
        for request_id, reason in reasons.items():
            if (request := self.requests.pop(request_id, None)) is None:
                continue
            for seq in request.seqs:
                self._end(seq, "error")
            out = self._output(request, pop=False)
            out.error = reason
            outputs.append(out)
        return outputs

    def _end(self, seq: Sequence, reason: str) -> None:
        if seq.status is Status.RUNNING:
            self.scheduler.finish(seq, reason)
        elif seq.status is Status.WAITING:
            self.scheduler.waiting.remove(seq)
            seq.status, seq.finish_reason = Status.FINISHED, reason

    def shutdown(self) -> None:
        """Stop tensor-parallel workers and free the CUDA graphs; the engine takes no more steps."""
        self.runner.shutdown()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        """One scheduled forward; returns the outputs of the requests it advanced (finished ones included).

        With async scheduling a greedy decode step returns the outputs of the step before it (the first
        returns none), and a step that cannot be launched ahead returns the one in flight's alone."""
        if self._in_flight is not None and not self._continues():
            return self._settle(self._in_flight)
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        ahead = self._launches_ahead(batch)
        if self._in_flight is not None and not ahead:
            raise RuntimeError("async scheduling: a step that continues the one in flight must launch ahead")
        try:
            inputs = ModelRunner.prepare(batch)
            inputs.sample_on_device = ahead
            if self._in_flight is not None:  # every row's last token is the in-flight step's
                row_of = {id(seq): row for row, seq in enumerate(self._in_flight.seqs)}
                inputs.fed_rows = list(range(len(batch.seqs)))
                inputs.fed_from = [row_of[id(seq)] for seq in batch.seqs]
            logits = self.runner.run(inputs)
        except Exception as err:  # one forward serves the whole batch: find whose requests it fails
            self.scheduler.settle_snapshots(batch, ran=False)
            self._in_flight = None  # its sequences are this batch's: they fail with it
            if (
                ahead
                or self.runner.num_state_slots
                or self.config.tensor_parallel_size > 1
                or len({seq.request_id for seq in batch.seqs}) == 1
            ):
                return self._forward_failed(batch.seqs, "model", err)
            return self._isolate(batch, err)
        self.consecutive_failures = 0
        if ahead:
            return self._launch(batch, logits)
        return self._advance(batch, inputs, logits)

    def _advance(self, batch: ScheduledBatch, inputs: StepInputs, logits) -> list[RequestOutput]:
        """After a synchronous forward: count its tokens as computed, sample (or verify drafts), emit."""
        if self.drafter is not None:
            return self._speculative_step(batch, inputs, logits)
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.blocks.register_full_blocks(seq)
        self.scheduler.settle_snapshots(batch, ran=True)
        sampled = [batch.seqs[row] for row in inputs.ends]
        result = sample(logits, sampled, backend=self.config.kernel_backend)
        touched, failed = {}, {}
        for seq, token, lp, error in zip(sampled, result.tokens, result.logprobs, result.errors, strict=True):
            if error is not None:
                failed.setdefault(seq.request_id, error)
                continue
            seq.append(token, lp)
            self._check_stop(seq)
            touched[seq.request_id] = self.requests[seq.request_id]
        return self._outputs(touched, failed)

    def _isolate(self, batch: ScheduledBatch, err: Exception) -> list[RequestOutput]:
        """A synchronous forward over several requests failed: run each half of them on its own, and halves
        of what fails again, so that only the requests whose own forward fails fail (a request's samples
        stay together). Rerunning is safe because a failed forward changed nothing a sequence reads: its
        KV rows lie past num_computed_tokens, to be written again (models with state layers, whose forward
        updates their state in place, are not rerun, nor tensor-parallel ones, whose ranks may have
        stopped apart: their whole batch fails). The step counts as one failure of the engine, and as
        none if any part of it ran."""
        logger.warning(
            "a model forward over %d sequences failed (%s): running them in halves to find the cause",
            len(batch.seqs),
            type(err).__name__,
        )
        before = self.consecutive_failures
        outputs, ran = self._rerun(batch)
        self.consecutive_failures = 0 if ran else before + 1
        return outputs

    def _rerun(self, batch: ScheduledBatch) -> tuple[list[RequestOutput], bool]:
        """batch's requests forwarded in two halves; the outputs, and whether any forward ran."""
        outputs, ran = [], False
        for half in _halves(batch):
            try:
                inputs = ModelRunner.prepare(half)
                logits = self.runner.run(inputs)
            except Exception as again:
                if len({seq.request_id for seq in half.seqs}) == 1:
                    outputs += self._forward_failed(half.seqs, "model", again)
                else:
                    more, more_ran = self._rerun(half)
                    outputs, ran = outputs + more, ran or more_ran
                continue
            ran = True
            outputs += self._advance(half, inputs, logits)
        return outputs, ran

    def _continues(self) -> bool:
        """Whether the next step can launch before the one in flight is read: every running sequence was
        in it and adds one token, none waits to be admitted, and no sequence needs preempting."""
        running = self.scheduler.running
        return (
            self.async_scheduling  # (turning it off settles the step in flight)
            and bool(running)
            and not self.scheduler.waiting
            and all(seq.num_pending == 1 and sampled_on_device(seq.params) for seq in running)
            and len(running) <= self.scheduler.config.max_num_batched_tokens
            and sum(self.blocks.blocks_needed(seq, 1) for seq in running) <= self.blocks.num_free_blocks
        )

    def _launches_ahead(self, batch: ScheduledBatch) -> bool:
        """Whether this batch's tokens stay on the device for the next step: a greedy decode step."""
        return (
            self.async_scheduling
            and not any(batch.drafts)
            and all(
                n == 1 and seq.num_uncomputed == 1
                for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True)
            )
            and all(sampled_on_device(seq.params) for seq in batch.seqs)
        )

    def _launch(self, batch: ScheduledBatch, logits) -> list[RequestOutput]:
        """After launching a greedy decode step: count its tokens as computed and pending, start their copy
        to the host, then settle the step before it (the GPU runs this one meanwhile)."""
        for seq in batch.seqs:
            seq.num_computed_tokens += 1
            seq.num_pending += 1
        self.scheduler.settle_snapshots(batch, ran=True)
        launched = InFlightStep.launch(batch.seqs, self.runner.greedy, self._host_tokens)
        previous, self._in_flight = self._in_flight, launched
        if previous is None:
            return []
        self.num_async_steps += 1
        outputs = self._settle(previous)
        if not any(seq.status is Status.RUNNING for seq in launched.seqs):
            self._in_flight = None  # everything it computes is dropped: nobody reads it
        return outputs

    def _settle(self, step: InFlightStep) -> list[RequestOutput]:
        """Read an in-flight step's tokens and advance its sequences as a synchronous step would have.
        Sequences that ended meanwhile (a stop at the step before, an abort, a failure) drop theirs."""
        if step is self._in_flight:
            self._in_flight = None
        tokens, finite = step.read()
        touched, failed = {}, {}
        for seq, token, ok in zip(step.seqs, tokens, finite, strict=True):
            if seq.status is not Status.RUNNING:
                continue
            seq.num_pending -= 1
            if not ok:
                failed.setdefault(seq.request_id, NON_FINITE)
                continue
            seq.append(token, None)
            self.blocks.register_full_blocks(seq)
            self._check_stop(seq)
            touched[seq.request_id] = self.requests[seq.request_id]
        return self._outputs(touched, failed)

    def _forward_failed(self, seqs: list[Sequence], model: str, err: Exception) -> list[RequestOutput]:
        """A forward serves the whole batch: its requests fail (the log has the traceback), later ones may run."""
        logger.exception("a %s forward failed; its %d sequences' requests fail", model, len(seqs))
        self.consecutive_failures += 1
        reason = f"the {model}'s forward failed ({type(err).__name__}; the server log has the details)"
        return self.fail(dict.fromkeys((s.request_id for s in seqs), reason))

    def _speculative_step(self, batch: ScheduledBatch, inputs: StepInputs, logits) -> list[RequestOutput]:
        """Accept each sequence's verified drafts, emit its tokens (stopping where a stop condition hits),
        keep the KV of accepted positions only, then let the draft propose for the next step."""
        sampled = [batch.seqs[row] for row in inputs.ends]
        drafts = [batch.drafts[row] for row in inputs.ends]
        result = verify(logits, sampled, drafts, backend=self.config.kernel_backend)
        accepted = dict(zip(inputs.ends, result.accepted, strict=True))
        for row, (seq, n, draft) in enumerate(
            zip(batch.seqs, batch.num_new_tokens, batch.drafts, strict=True)
        ):
            # rejected drafts' KV rows stay behind num_computed_tokens: overwritten, never read
            seq.num_computed_tokens += n - len(draft) + accepted.get(row, 0)
            if draft and seq.state_slot >= 0:  # state layers kept each token's state: keep the accepted
                seq.commit_state(accepted.get(row, 0))
        self.scheduler.settle_snapshots(batch, ran=True)
        touched, failed = {}, {}
        for seq, draft, tokens, lps, n_ok, error in zip(
            sampled, drafts, result.tokens, result.logprobs, result.accepted, result.errors, strict=True
        ):
            if error is not None:
                failed.setdefault(seq.request_id, error)
                continue
            seq.num_drafted += len(draft)
            seq.num_accepted += n_ok
            self.num_draft_tokens += len(draft)
            self.num_accepted_tokens += n_ok
            self.num_verifications += bool(draft)
            for i, token in enumerate(tokens):
                seq.append(token, None if lps is None else lps[i])
                self._check_stop(seq)
                if seq.status is Status.FINISHED:
                    break
            touched[seq.request_id] = self.requests[seq.request_id]
        for seq in batch.seqs:
            if seq.status is Status.RUNNING:
                self.blocks.register_full_blocks(seq)
        outputs = self.fail(failed)
        try:
            self.drafter.propose(batch, inputs)
        except Exception as err:  # as a failed target forward
            running = [s for s in batch.seqs if s.status is Status.RUNNING]
            outputs += self._forward_failed(running, "draft model", err)
        live = {i: r for i, r in touched.items() if i in self.requests}  # failed ones were popped
        return outputs + self._outputs(live, {})

    def _check_stop(self, seq: Sequence) -> None:
        p = seq.params
        token = seq.output_token_ids[-1]
        if self.tokenizer is not None:
            if seq.detokenizer is None:
                seq.detokenizer = IncrementalDetokenizer(self.tokenizer)
            seq.text = seq.detokenizer.update(seq.output_token_ids)
        reason = None
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            reason = "stop"
        elif (cut := _stop_string_start(seq)) >= 0:
            seq.text, reason = seq.text[:cut], "stop"
            seq.detokenizer = None  # the text is final
        elif len(seq.output_token_ids) >= p.max_tokens or len(seq.token_ids) >= self.max_model_len:
            reason = "length"
        if reason is not None:
            if seq.detokenizer is not None:  # emit characters still waiting for their last bytes
                seq.text = seq.detokenizer.update(seq.output_token_ids, final=True)
            self.scheduler.finish(seq, reason)

    def _output(self, request: _Request, pop: bool) -> RequestOutput | None:
        """The request's output after a step, as its output kind asks (None: FINAL_ONLY, still running)."""
        finished = all(s.status is Status.FINISHED for s in request.seqs)
        if finished and pop:
            self.requests.pop(request.request_id, None)
        kind = request.seqs[0].params.output_kind
        if kind is OutputKind.FINAL_ONLY and not finished:
            return None
        outputs = [_completion(s, delta=kind is OutputKind.DELTA) for s in request.seqs]
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, outputs, finished)

    def _outputs(self, touched: dict[str, _Request], failed: dict[str, str]) -> list[RequestOutput]:
        """A step's outputs: the failed requests' errors, then each advanced request's output."""
        outputs = self.fail(failed)
        for request in touched.values():
            if request.request_id not in failed and (out := self._output(request, pop=True)) is not None:
                outputs.append(out)
        return outputs


def _halves(batch: ScheduledBatch) -> list[ScheduledBatch]:
    """batch's requests in two batches, each request's samples together (no state snapshots: only models
    without state layers rerun)."""
    requests = list(dict.fromkeys(seq.request_id for seq in batch.seqs))
    first = set(requests[: len(requests) // 2])
    halves = []
    for part in (first, set(requests) - first):
        rows = [i for i, seq in enumerate(batch.seqs) if seq.request_id in part]
        halves.append(
            ScheduledBatch(
                [batch.seqs[i] for i in rows],
                [batch.num_new_tokens[i] for i in rows],
                [batch.drafts[i] for i in rows],
            )
        )
    return halves


def _stop_string_start(seq: Sequence) -> int:
    """Where the first stop string completed by seq's new text starts (-1: none): the request's automaton
    walks only the characters added since the last call."""
    stops = seq.params.stop_strings()
    if stops is None:
        return -1
    if seq.stop_scan is None:
        seq.stop_scan = StopScan(stops)
    return seq.stop_scan.feed(seq.text)


def _settled_length(seq: Sequence) -> int:
    """How much of seq's text is settled: all but a tail that may still become a stop string while it
    runs. What is reported (and streamed) never has to be taken back, so streamed text equals the final
    text."""
    if seq.status is Status.FINISHED or seq.stop_scan is None:
        return len(seq.text)
    return len(seq.text) - seq.stop_scan.held


def _completion(seq: Sequence, *, delta: bool) -> CompletionOutput:
    """seq's output: all of it, or (delta) what earlier outputs have not carried, without copying the rest.
    Settled text only grows (a stop string found later starts inside the held-back tail), so a delta
    never takes text back."""
    settled, tokens = _settled_length(seq), seq.output_token_ids
    start_char, start_token = (seq.num_sent_chars, seq.num_sent_tokens) if delta else (0, 0)
    if delta:
        seq.num_sent_chars, seq.num_sent_tokens = settled, len(tokens)
    return CompletionOutput(
        seq.index,
        seq.text[start_char:settled],
        tokens[start_token:],
        seq.finish_reason,
        seq.output_logprobs[start_token:] if seq.params.logprobs is not None else None,
        seq.num_drafted,
        seq.num_accepted,
    )
