"""OpenAI-compatible request bodies; sampling fields map to SamplingParams (which validates them)."""

from __future__ import annotations

from pydantic import BaseModel, Field

from atom_core.engine.sampling_params import SamplingParams


class _Sampling(BaseModel):
    model: str | None = None
    max_tokens: int | None = 16
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    n: int = 1
    seed: int | None = None
    stop: str | list[str] | None = None
    stream: bool = False
    ignore_eos: bool = False

    def sampling_params(self, logprobs: int | None, max_n: int) -> SamplingParams:
        if self.n > max_n:
            raise ValueError(f"n must be at most {max_n}")
        return SamplingParams(n=self.n, temperature=self.temperature, top_p=self.top_p, top_k=self.top_k,
                              min_p=self.min_p, seed=self.seed, max_tokens=self.max_tokens or 16, stop=self.stop,
                              ignore_eos=self.ignore_eos, logprobs=logprobs)  # fmt: skip


class CompletionRequest(_Sampling):
    prompt: str | list[int]
    logprobs: int | None = None


class ChatMessage(BaseModel):
    role: str
    content: str


class ChatCompletionRequest(_Sampling):
    messages: list[ChatMessage] = Field(min_length=1)
