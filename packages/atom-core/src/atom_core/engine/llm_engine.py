"""The engine: requests in, scheduled steps through the model runner, finished outputs out."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from pathlib import Path

import torch

from atom_core.config import CacheConfig, ModelConfig, ParallelConfig
from atom_core.engine.block_manager import BlockManager
from atom_core.engine.detokenizer import IncrementalDetokenizer
from atom_core.engine.model_runner import ModelRunner
from atom_core.engine.outputs import CompletionOutput, RequestOutput
from atom_core.engine.sampler import sample
from atom_core.engine.sampling_params import SamplingParams
from atom_core.engine.scheduler import Scheduler, SchedulerConfig
from atom_core.engine.sequence import Sequence, Status
from atom_core.engine.tensor_parallel import TensorParallelRunner

Prompt = str | list[int] | dict


@dataclass(slots=True)
class _Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence] = field(default_factory=list)


class LLMEngine:
    def __init__(self, model: str | Path | None = None, *, dtype: str = "auto", max_model_len: int | None = None,
                 load_format: str = "safetensors", tensor_parallel_size: int = 1, block_size: int = 16,
                 num_kv_blocks: int | None = None, kv_cache_dtype: str = "auto", kv_layout: str = "flash",
                 max_num_seqs: int = 256, max_num_batched_tokens: int = 8192, device: str | None = None,
                 kernel_backend: str | None = None, gpu_memory_utilization: float = 0.9,
                 enforce_eager: bool = False):  # fmt: skip
        """enforce_eager: no CUDA graphs (by default decode steps of up to max_num_seqs replay captured graphs
        on GPUs; the CPU is always eager)."""
        if tensor_parallel_size < 1:
            raise ValueError("tensor_parallel_size must be at least 1")
        if model is None:
            from atom_core.demo import ensure_demo_checkpoint

            model = ensure_demo_checkpoint(log=lambda _: None)
        self.model_config = ModelConfig.from_pretrained(model, dtype=dtype)
        self.max_model_len = max_model_len or self.model_config.max_position_embeddings
        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        cache = CacheConfig(
            block_size=block_size, layout=kv_layout, kv_dtype=kv_cache_dtype, num_blocks=num_kv_blocks
        )
        runner_args = dict(load_format=load_format, kernel_backend=kernel_backend,
                           memory_fraction=gpu_memory_utilization, cuda_graphs=not enforce_eager,
                           max_num_seqs=max_num_seqs, max_model_len=self.max_model_len)  # fmt: skip
        if tensor_parallel_size > 1:
            self.runner = TensorParallelRunner(tensor_parallel_size, self.model_config, cache, device=self.device,
                                               **runner_args)  # fmt: skip
        else:
            self.runner = ModelRunner(self.model_config, cache, parallel=ParallelConfig(), device=self.device,
                                      **runner_args)  # fmt: skip
        self.blocks = BlockManager(self.runner.num_blocks, block_size)
        self.scheduler = Scheduler(SchedulerConfig(max_num_seqs, max_num_batched_tokens), self.blocks)
        self.tokenizer = self._load_tokenizer(Path(model))
        self.eos_token_ids = self._eos_ids()
        self.requests: dict[str, _Request] = {}
        self._ids = itertools.count()

    @staticmethod
    def _load_tokenizer(path: Path):
        if not any(
            (path / f).is_file() for f in ("tokenizer.json", "tokenizer_config.json", "tokenizer.model")
        ):
            return None
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)

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
        return prompt, self.tokenizer(prompt).input_ids

    def add_request(
        self, prompt: Prompt, params: SamplingParams | None = None, request_id: str | None = None
    ) -> str:
        params = params or SamplingParams()
        text, ids = self.tokenize(prompt)
        vocab = self.model_config.vocab_size
        if not ids:
            raise ValueError("the prompt is empty")
        if any(not 0 <= t < vocab for t in ids):
            raise ValueError(f"prompt token ids must be in [0, {vocab})")
        if len(ids) + params.max_tokens > self.max_model_len:
            raise ValueError(
                f"prompt ({len(ids)} tokens) + max_tokens ({params.max_tokens}) exceeds the model's "
                f"max_model_len {self.max_model_len}"
            )
        request_id = request_id if request_id is not None else str(next(self._ids))
        if request_id in self.requests:
            raise ValueError(f"request id {request_id!r} is already in use")
        request = _Request(request_id, text, ids)
        for i in range(params.n):
            seq = Sequence(request_id, i, ids, params)
            request.seqs.append(seq)
            self.scheduler.add(seq)
        self.requests[request_id] = request
        return request_id

    def abort(self, request_id: str) -> None:
        request = self.requests.pop(request_id, None)
        for seq in request.seqs if request else []:
            if seq.status is Status.RUNNING:
                self.scheduler.finish(seq, "abort")
            elif seq in self.scheduler.waiting:
                self.scheduler.waiting.remove(seq)

    def shutdown(self) -> None:
        """Stop tensor-parallel workers and free the CUDA graphs; the engine takes no more steps."""
        self.runner.shutdown()

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        """One scheduled forward; returns the outputs of the requests it advanced (finished ones included)."""
        batch = self.scheduler.schedule()
        if not batch.seqs:
            return []
        inputs = ModelRunner.prepare(batch)
        logits = self.runner.run(inputs)
        ends = inputs.ends
        for seq, n in zip(batch.seqs, batch.num_new_tokens, strict=True):
            seq.num_computed_tokens += n
            self.blocks.register_full_blocks(seq)
        sampled = [batch.seqs[row] for row in ends]
        tokens, logprobs = sample(logits, [s.params for s in sampled], [s.generator for s in sampled])
        touched = {}
        for seq, token, lp in zip(sampled, tokens, logprobs, strict=True):
            seq.append(token, lp)
            self._check_stop(seq)
            touched[seq.request_id] = self.requests[seq.request_id]
        return [self._output(r, pop=True) for r in touched.values()]

    def _check_stop(self, seq: Sequence) -> None:
        p = seq.params
        token = seq.output_token_ids[-1]
        searched = len(seq.text)  # stop strings wholly inside this text were already looked for
        if self.tokenizer is not None:
            if seq.detokenizer is None:
                seq.detokenizer = IncrementalDetokenizer(self.tokenizer)
            seq.text = seq.detokenizer.update(seq.output_token_ids)
        reason = None
        if token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            reason = "stop"
        elif p.stop and (cut := self._find_stop(seq.text, p.stop, searched)) >= 0:
            seq.text, reason = seq.text[:cut], "stop"
            seq.detokenizer = None  # the text is final
        elif len(seq.output_token_ids) >= p.max_tokens or len(seq.token_ids) >= self.max_model_len:
            reason = "length"
        if reason is not None:
            if seq.detokenizer is not None:  # emit characters still waiting for their last bytes
                seq.text = seq.detokenizer.update(seq.output_token_ids, final=True)
            self.scheduler.finish(seq, reason)

    @staticmethod
    def _find_stop(text: str, stops: list[str], searched: int) -> int:
        """The first index where a stop string starts in text, looking only where new text can complete one."""
        hits = [i for s in stops if (i := text.find(s, max(0, searched - len(s) + 1))) >= 0]
        return min(hits, default=-1)

    def _output(self, request: _Request, pop: bool) -> RequestOutput:
        finished = all(s.status is Status.FINISHED for s in request.seqs)
        if finished and pop:
            self.requests.pop(request.request_id, None)
        outputs = [
            CompletionOutput(s.index, s.text, list(s.output_token_ids), s.finish_reason,
                             list(s.output_logprobs) if s.params.logprobs is not None else None)
            for s in request.seqs
        ]  # fmt: skip
        return RequestOutput(request.request_id, request.prompt, request.prompt_token_ids, outputs, finished)
