"""OpenAI request bodies, strict: every field is either implemented or refused with its name.

Types are strict ("5" is not an integer, true is not a number), unknown fields are refused, strings must be
valid Unicode (a lone surrogate is refused here, not by the tokenizer). Sampling fields map to
SamplingParams, which checks their ranges.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from atom_core.engine.sampling_params import SamplingParams
from atom_core.engine.structured.params import StructuredOutputsParams
from atom_core.entrypoints.openai.chat_messages import ChatMessage
from atom_core.entrypoints.openai.harmony_grammar import final_answer_grammar
from atom_core.entrypoints.openai.text_field import Text
from atom_core.entrypoints.openai.tool_calls import tool_constraint, tool_mode
from atom_core.entrypoints.openai.tool_protocol import ToolChoice, ToolDef, tools_field

MAX_N = 16
MAX_PROMPTS = 64  # a completion's list of prompts, each its own engine request
MAX_CHOICES = 256  # prompts x n: what one request may put in the engine at once
# far above what a real conversation sends: bounds what one request makes the tokenizer thread do
MAX_MESSAGES = 4096


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    include_usage: bool = False


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)
    name: Text
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: bool | None = None  # (the schema is always held strictly: no property it does not list)


class ResponseFormat(BaseModel):
    """OpenAI's response_format."""

    model_config = ConfigDict(extra="forbid", strict=True)
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(BaseModel):
    """vLLM's structured_outputs request field: exactly one constraint."""

    model_config = ConfigDict(extra="forbid", strict=True)
    json_: dict[str, Any] | Text | None = Field(default=None, alias="json")
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None
    json_object: bool | None = None


class _Request(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    model: Text | None = None
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # vLLM's extension, as are min_p, repetition_penalty, stop_token_ids, ignore_eos
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[int] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    ignore_eos: bool = False
    min_tokens: int = 0  # vLLM's extensions too, as SamplingParams takes them
    skip_special_tokens: bool = True
    include_stop_str_in_output: bool = False
    user: Text | None = None  # the caller's end-user id: metadata, it changes no answer
    logit_bias: dict[str, float] | None = None
    response_format: ResponseFormat | None = None  # OpenAI's
    structured_outputs: StructuredOutputs | None = None  # vLLM's

    def structured(self, harmony: bool = False) -> StructuredOutputsParams | None:
        """What the output must match, from response_format or structured_outputs (not both). (harmony,
        an answer read as messages, is a chat's: ChatCompletionRequest.structured.)"""
        fmt, so = self.response_format, self.structured_outputs
        if fmt is not None and so is not None:
            raise ValueError("give response_format or structured_outputs, not both")
        if so is not None:
            return StructuredOutputsParams(
                json=so.json_,
                regex=so.regex,
                choice=so.choice,
                grammar=so.grammar,
                json_object=bool(so.json_object),
            )
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return StructuredOutputsParams(json_object=True)
        if fmt.json_schema is None or fmt.json_schema.schema_ is None:
            raise ValueError("response_format json_schema needs json_schema.schema")
        return StructuredOutputsParams(json=fmt.json_schema.schema_)

    def sampling_params(
        self, max_tokens: int, logprobs: int | None, defaults: dict | None = None, harmony: bool = False
    ) -> SamplingParams:
        """defaults: the checkpoint's sampling defaults (engine/generation_defaults.py), for the fields
        this request leaves unset; harmony: a chat answered in the harmony format."""
        if self.n > MAX_N:
            raise ValueError(f"n must be at most {MAX_N}")
        if self.logit_bias:
            raise ValueError("logit_bias is not supported")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options is only allowed with stream: true")
        unset = {
            k: v for k, v in (defaults or {}).items() if k != "max_tokens" and k not in self.model_fields_set
        }
        return SamplingParams(
            n=self.n,
            temperature=unset.get("temperature", self.temperature),
            top_p=unset.get("top_p", self.top_p),
            top_k=unset.get("top_k", self.top_k),
            min_p=unset.get("min_p", self.min_p),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty,
            repetition_penalty=unset.get("repetition_penalty", self.repetition_penalty),
            seed=self.seed,
            max_tokens=max_tokens,
            stop=self.stop,
            stop_token_ids=list(self.stop_token_ids or []),
            ignore_eos=self.ignore_eos,
            logprobs=logprobs,
            min_tokens=self.min_tokens,
            skip_special_tokens=self.skip_special_tokens,
            include_stop_str_in_output=self.include_stop_str_in_output,
            structured_outputs=self.structured(harmony),
        )

    @property
    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage


class CompletionRequest(_Request):
    # one prompt (text or token ids) or a list of them (prompt_batch.py)
    prompt: Text | list[int] | list[Text] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool = False
    suffix: Text | None = None
    best_of: int | None = None

    def prompts(self) -> list[str | dict]:
        """Each prompt as the engine takes it: text, or {"prompt_token_ids": [...]}."""
        many = isinstance(self.prompt, list) and self.prompt and not isinstance(self.prompt[0], int)
        prompts = self.prompt if many else [self.prompt]
        return [p if isinstance(p, str) else {"prompt_token_ids": p} for p in prompts]

    def checked_params(self, defaults: dict | None = None) -> SamplingParams:
        """defaults: the checkpoint's sampling defaults, for the fields left unset (max_tokens too)."""
        count = len(self.prompts())
        if count > MAX_PROMPTS:
            raise ValueError(f"prompt holds {count} prompts: at most {MAX_PROMPTS} are accepted")
        if count > 1 and count * self.n > MAX_CHOICES:  # (one prompt: n's own bound)
            raise ValueError(
                f"{count} prompts x n={self.n} is {count * self.n} choices: at most {MAX_CHOICES}"
            )
        if self.echo and count > 1:
            raise ValueError("echo with a list of prompts is not supported: send them one at a time")
        if self.suffix:
            raise ValueError("suffix is not supported")
        if self.best_of is not None and self.best_of != self.n:
            raise ValueError("best_of is not supported (other than equal to n)")
        budget = (
            self.max_tokens if "max_tokens" in self.model_fields_set else (defaults or {}).get("max_tokens")
        )
        params = self.sampling_params(16 if budget is None else budget, self.logprobs, defaults)
        if self.echo and self.logprobs is not None:  # the echoed prompt's tokens carry theirs too
            params = dataclasses.replace(params, prompt_logprobs=self.logprobs)
        return params


class ChatCompletionRequest(_Request):
    messages: list[ChatMessage] = Field(min_length=1, max_length=MAX_MESSAGES)
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's: variables for the template (enable_thinking)
    # OpenAI's: given to the chat template as its `reasoning_effort` variable (GPT-OSS's reads it), as SGLang
    # does; chat_template_kwargs may set it too, and then win
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high", "xhigh"] | None = None
    tools: list[ToolDef] | None = tools_field()
    tool_choice: ToolChoice | None = None  # default: "auto" with tools, "none" without
    parallel_tool_calls: bool = True

    def structured(self, harmony: bool = False) -> StructuredOutputsParams | None:
        """A named or required tool_choice's grammar, or what response_format / structured_outputs ask
        (harmony: on the answer's messages, where "auto" keeps the tools callable)."""
        forced = tool_constraint(self.tools, self.tool_choice, self.parallel_tool_calls, harmony=harmony)
        asked = super().structured()
        if forced is not None and asked is not None:
            raise ValueError(
                "tool_choice and response_format (or structured_outputs) both shape the answer: give one"
            )
        if forced is not None or asked is None or not harmony:
            return forced or asked
        callable_tools = self.tools if tool_mode(self.tools, self.tool_choice) == "auto" else None
        return final_answer_grammar(asked, callable_tools)

    def template_kwargs(self) -> dict[str, Any] | None:
        """The variables the chat template gets: chat_template_kwargs, and reasoning_effort unless they
        set it."""
        if self.reasoning_effort is None:
            return self.chat_template_kwargs
        return {"reasoning_effort": self.reasoning_effort, **(self.chat_template_kwargs or {})}

    def template_tools(self) -> list[dict] | None:
        return [t.model_dump(exclude_none=True) for t in self.tools] if self.tools else None

    def checked_params(
        self, room: int, defaults: dict | None = None, harmony: bool = False
    ) -> SamplingParams:
        """room: tokens left in max_model_len after the prompt (the default budget, as vLLM's, capped by
        the checkpoint's max_new_tokens); defaults: the checkpoint's sampling defaults, for unset fields;
        harmony: the answer is read in the harmony format (constraints are held to its messages)."""
        if (
            None not in (self.max_tokens, self.max_completion_tokens)
            and self.max_tokens != self.max_completion_tokens
        ):
            raise ValueError("max_tokens and max_completion_tokens disagree; give one")
        if self.top_logprobs is not None and not self.logprobs:
            raise ValueError("top_logprobs needs logprobs: true")
        budget = self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens
        if budget is None:
            budget = min(max(room, 1), (defaults or {}).get("max_tokens", max(room, 1)))
        logprobs = (self.top_logprobs or 0) if self.logprobs else None
        return self.sampling_params(budget, logprobs, defaults, harmony)
