"""The offline Python API, as vLLM users write it: LLM(model=...).generate(prompts, sampling_params),
LLM.chat(messages), `with LLM(...) as llm:`."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence as Seq

from atom_core.config import ConfigError
from atom_core.engine.config import EngineConfig
from atom_core.engine.llm_engine import LLMEngine, Prompt
from atom_core.engine.outputs import OutputKind, RequestOutput
from atom_core.engine.sampling_params import SamplingParams
from atom_core.engine.text.chat_template import chat_prompt_ids

ENGINE_ARGS = frozenset(f.name for f in dataclasses.fields(EngineConfig))

Messages = list[dict[str, str]]


def engine_args(kwargs: dict) -> dict:
    """LLM()'s keywords as EngineConfig takes them: its fields (vLLM's names) as they are; vLLM's
    trust_remote_code accepted when False (ATOM runs no checkpoint code) and refused when True; any other
    keyword refused by name, with what is supported."""
    args = {}
    for name, value in kwargs.items():
        if name in ENGINE_ARGS:
            args[name] = value
        elif name == "trust_remote_code":
            if value:
                raise ConfigError(
                    "trust_remote_code=True: ATOM runs no code from a checkpoint (its models are its own); "
                    "leave it out"
                )
        else:
            raise ConfigError(
                f"LLM() got {name}={value!r}, which ATOM does not take; it takes: {', '.join(sorted(ENGINE_ARGS))}"
            )
    return args


class LLM:
    """LLM(model=None (the built-in demo), dtype="auto", tensor_parallel_size=1, max_model_len=None,
    seed=None, tokenizer=None, enable_prefix_caching=None, ...): the keyword arguments are EngineConfig's
    fields, named as vLLM names them."""

    def __init__(self, model=None, **kwargs):
        self.engine = LLMEngine(EngineConfig(model=model, **engine_args(kwargs)))

    @classmethod
    def from_engine_config(cls, config: EngineConfig) -> LLM:
        llm = cls.__new__(cls)
        llm.engine = LLMEngine(config)
        return llm

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __enter__(self) -> LLM:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    def get_tokenizer(self):
        """The checkpoint's tokenizer (a transformers tokenizer), or None when it ships none (vLLM's)."""
        return self.engine.tokenizer

    def get_default_sampling_params(self) -> SamplingParams:
        """What generate() samples with when given no SamplingParams: SamplingParams' defaults, under the
        checkpoint's generation_config.json where it sets them (as vLLM's; generation_config="vllm": none)."""
        return SamplingParams(**self.engine.generation_defaults)

    def generate(
        self,
        prompts: Prompt | Seq[Prompt],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
    ) -> list[RequestOutput]:
        """Generate for every prompt (text, {"prompt_token_ids": [...]}, or a list of either); outputs in
        order. use_tqdm: a progress bar of finished prompts on stderr."""
        single = isinstance(prompts, str | dict) or (
            isinstance(prompts, list) and prompts and isinstance(prompts[0], int)
        )
        prompts = [prompts] if single else list(prompts)
        params = (
            sampling_params
            if isinstance(sampling_params, Seq)
            else [sampling_params or self.get_default_sampling_params()] * len(prompts)
        )
        if len(params) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(params)} sampling params")
        # only the finished outputs are read: the engine builds no others (the caller's params untouched)
        params = [dataclasses.replace(sp, output_kind=OutputKind.FINAL_ONLY) for sp in params]
        ids = [self.engine.add_request(p, sp) for p, sp in zip(prompts, params, strict=True)]
        finished: dict[str, RequestOutput] = {}
        with _progress(len(ids), use_tqdm) as bar:
            while len(finished) < len(ids):
                for out in self.engine.step():
                    if out.finished:
                        finished[out.request_id] = out
                        bar.update(1)
        return [finished[i] for i in ids]

    def chat(
        self,
        messages: Messages | Seq[Messages],
        sampling_params: SamplingParams | Seq[SamplingParams] | None = None,
        use_tqdm: bool = True,
        chat_template: str | None = None,
    ) -> list[RequestOutput]:
        """Generate the assistant's reply to a conversation ([{"role", "content"}, ...]) or to each of a
        list of them, through the tokenizer's chat template (or chat_template's Jinja text) with the
        generation prompt appended, as the server's /v1/chat/completions renders them."""
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError("this model has no tokenizer, so no chat template")
        conversations = [messages] if messages and isinstance(messages[0], dict) else list(messages)
        prompts = [
            {"prompt_token_ids": chat_prompt_ids(tokenizer, list(c), template=chat_template)}
            for c in conversations
        ]
        return self.generate(prompts, sampling_params, use_tqdm=use_tqdm)


def _progress(total: int, shown: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="Processed prompts", unit="prompt", disable=not shown, dynamic_ncols=True)
