"""The engine: requests in, scheduled steps through the model runner, finished outputs out.

Its parts, each built once from the runner's plan (engine/plan.py): the scheduler (scheduling/), which owns
the KV blocks and state slots; the runner (execution/), which runs a step and returns its results; the
drafter (speculation/), with a speculative config; and the step pipeline (steps/), which turns results
into tokens and outputs through one emit stage.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import random
from pathlib import Path

from atom_core.config import ConfigError, ModelConfig, ParallelConfig
from atom_core.engine.config import EngineConfig
from atom_core.engine.execution.model_runner import ModelRunner
from atom_core.engine.execution.runner import Runner
from atom_core.engine.execution.tensor_parallel import TensorParallelRunner
from atom_core.engine.generation_defaults import described, generation_defaults
from atom_core.engine.outputs import RequestOutput
from atom_core.engine.plan import check_max_model_len
from atom_core.engine.sampling_params import SamplingParams
from atom_core.engine.scheduling.scheduler import Scheduler
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.engine.speculation.drafting import Drafter
from atom_core.engine.steps.emit import Emitter
from atom_core.engine.steps.failures import Failures
from atom_core.engine.steps.pipeline import StepPipeline
from atom_core.engine.steps.request_timing import RequestObserver
from atom_core.engine.steps.requests import Request, RequestTable
from atom_core.engine.steps.stats import StepStats
from atom_core.engine.steps.stop_check import StopCheck
from atom_core.engine.structured.grammars import Grammars
from atom_core.engine.text.chat_template import chat_template_text
from atom_core.engine.tokenizing import Prompt, Tokenizing

__all__ = ["LLMEngine", "Prompt"]

logger = logging.getLogger("atom.engine")


class LLMEngine:
    """The native engine for one EngineConfig (LLM(...) builds one from keyword arguments)."""

    def __init__(self, config: EngineConfig):
        self.config = config
        model = config.model
        if model is None:
            from atom_core.demo import ensure_demo_checkpoint

            model = ensure_demo_checkpoint(log=lambda _: None)
        self.model_config = ModelConfig.from_pretrained(model, dtype=config.dtype)
        # a request's unset sampling fields take these (checked before anything loads)
        self.generation_defaults = generation_defaults(self.model_config, config.generation_config)
        if self.generation_defaults:
            logger.info(
                "sampling defaults from the checkpoint's generation config: %s (generation_config='vllm' "
                "ignores them)",
                described(self.generation_defaults),
            )
        check_max_model_len(config.max_model_len, self.model_config)  # before loading anything
        tokenizer_dir = Path(config.tokenizer).expanduser() if config.tokenizer is not None else Path(model)
        if not tokenizer_dir.is_dir():  # (the paths are checked before anything loads)
            raise ConfigError(f"tokenizer {config.tokenizer}: no such directory")
        template = chat_template_text(config.chat_template)
        # requests that bring no seed take one from here (config.seed), or from torch's generator
        self._seeds = random.Random(config.seed) if config.seed is not None else None
        self.device = config.torch_device()
        self.runner: Runner = (
            TensorParallelRunner(self.model_config, config, device=self.device)
            if config.tensor_parallel_size > 1
            else ModelRunner(self.model_config, config, parallel=ParallelConfig(), device=self.device)
        )
        self.plan = plan = self.runner.plan
        plan.log()
        self.max_model_len = plan.max_model_len
        self.scheduler = Scheduler(config.scheduler_config(), plan)
        self.blocks = self.scheduler.blocks
        self.drafter = (
            None if plan.num_speculative_tokens == 0 else Drafter(self.runner, self.scheduler, plan)
        )
        self.tokenizing = Tokenizing(tokenizer_dir, self.model_config, self.max_model_len)
        self.tokenizer, self.eos_token_ids = self.tokenizing.tokenizer, self.tokenizing.eos_token_ids
        if template is not None and self.tokenizer is not None:
            self.tokenizer.chat_template = template
        self.requests = RequestTable(self.scheduler)
        self._grammars: Grammars | None = None  # built with the first structured request
        self.stats = StepStats()
        stop_check = StopCheck(self.tokenizer, self.eos_token_ids, self.max_model_len, self.scheduler)
        # rerunning a failed forward's halves is safe only where it changed nothing a sequence reads
        rerun_safe = not plan.has_state and config.tensor_parallel_size == 1
        self.pipeline = StepPipeline(
            plan,
            self.runner,
            self.scheduler,
            Emitter(self.requests, stop_check, self.blocks),
            self.drafter,
            Failures(self.runner, self.requests, self.stats, rerun_safe=rerun_safe),
            self.stats,
            kernel_backend=config.kernel_backend,
            device=self.device,
            masks_ahead=config.tensor_parallel_size == 1,  # (each tensor-parallel rank draws its own)
        )
        self._ids = itertools.count()
        self.shut_down = False

    def tokenize(self, prompt: Prompt) -> tuple[str | None, list[int]]:
        return self.tokenizing.tokenize(prompt)

    @property
    def max_prompt_chars(self) -> int:
        """No prompt text longer than this fits max_model_len tokens (Tokenizing.max_prompt_chars)."""
        return self.tokenizing.max_prompt_chars

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        """Validate the whole request, then queue all its samples: a request that raises ValueError
        left nothing behind."""
        if self.shut_down:
            raise RuntimeError("this engine was shut down and takes no more requests: start a new one")
        params = params or SamplingParams()
        if params.seed is None and self._seeds is not None:
            params = dataclasses.replace(params, seed=self._seeds.getrandbits(63))
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
        # before min_tokens, the tokens that would stop it are banned (vLLM's: EOS unless ignored, stop ids)
        banned = params.stop_token_ids | (frozenset() if params.ignore_eos else frozenset(self.eos_token_ids))
        banned = frozenset(banned) if params.min_tokens else frozenset()
        seqs = [Sequence(request_id, i, ids, params, min_tokens_stops=banned) for i in range(params.n)]
        if params.structured_outputs is not None:  # each sample's own matcher, over one compiled grammar
            compiled, stops = self.compile_grammar(params), sorted(params.stop_token_ids | self.eos_token_ids)
            for seq in seqs:
                seq.grammar = self._grammars.matcher(compiled, stops)
        self.requests.add(Request(request_id, text, ids, seqs))
        return request_id

    def abort(self, request_id: str) -> None:
        self.requests.abort(request_id)

    def compile_grammar(self, params: SamplingParams) -> object:
        """params' structured output compiled (once: kept on params; the server compiles it off the engine's
        thread); ValueError naming what is wrong, or what cannot carry one."""
        if params._grammar is None:
            if self._grammars is None and self.tokenizer is None:
                raise ValueError("structured outputs need the checkpoint's tokenizer, and this one has none")
            if self.drafter is not None:
                raise ValueError(
                    "structured outputs are not supported with speculative decoding yet: serve without "
                    "--speculative-config for them"
                )
            if self._grammars is None:
                self._grammars = Grammars.for_tokenizer(self.tokenizer, self.model_config.vocab_size)
            params._grammar = self._grammars.compile(params.structured_outputs)
        return params._grammar

    def observe_requests(self, observer: RequestObserver | None) -> None:
        """Tell observer each request's first token, new tokens and end as they happen (the server's
        metrics), on the thread that steps the engine; None stops."""
        self.requests.observer = observer

    def fail(self, reasons: dict[str, str]) -> list[RequestOutput]:
        """End these requests ({request id: why}) with an error, their blocks freed; the engine goes on
        with the others."""
        return self.requests.fail(reasons)

    def shutdown(self) -> None:
        """Stop tensor-parallel workers, free the CUDA graphs, weights and caches and hand their memory back
        to the device; the engine takes no more requests (a second call does nothing)."""
        self.runner.shutdown()
        if self._grammars is not None:
            self._grammars.shutdown()
        self.shut_down = True

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        """One scheduled forward; returns the outputs of the requests it advanced (finished ones included).

        With async scheduling a greedy decode step returns the outputs of the step before it (the first
        returns none), and a step that cannot be launched ahead returns the one in flight's alone."""
        return self.pipeline.step()
