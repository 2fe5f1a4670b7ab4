"""The native engine: scheduler, paged KV with prefix caching, model runner, sampler, LLM API."""

from atom_core.engine.llm import LLM
from atom_core.engine.llm_engine import LLMEngine
from atom_core.engine.outputs import CompletionOutput, RequestOutput
from atom_core.engine.sampling_params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "LLMEngine", "RequestOutput", "SamplingParams"]
