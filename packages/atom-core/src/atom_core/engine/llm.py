"""The offline Python API: LLM(model=...).generate(prompts, sampling_params)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq

from atom_core.engine.config import EngineConfig
from atom_core.engine.llm_engine import LLMEngine, Prompt
from atom_core.engine.outputs import OutputKind, RequestOutput
from atom_core.engine.sampling_params import SamplingParams


class LLM:
    """LLM(model=None (the built-in demo), dtype="auto", tensor_parallel_size=1, max_model_len=None,
    load_format="safetensors" | "dummy", ...): the keyword arguments are EngineConfig's fields."""

    def __init__(self, model=None, **engine_args):
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args))

    @classmethod
    def from_engine_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = LLMEngine(config)
        return llm

    def shutdown(self) -> None:
        self.engine.shutdown()

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, {"prompt_token_ids": [...]}, or a list of either); outputs in order."""
        single = isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        )
        prompts = [prompts] if single else list(prompts)
        params = (
            sampling_params
            if isinstance(sampling_params, Seq)
            else [sampling_params or SamplingParams()] * len(prompts)
        )
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        # only the finished outputs are read: the engine builds no others (the caller's params untouched)
        params = [dataclasses.replace(sp, output_kind=OutputKind.FINAL_ONLY) for sp in params]
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        finished: dict[str, RequestOutput] = {}
        while len(finished) < len(ids):
            for out in self.engine.step():
                if out.finished:
                    finished[out.request_id] = out
        return [finished[i] for i in ids]
