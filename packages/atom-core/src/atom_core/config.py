"""Configs: slotted dataclasses that validate when built and name the problem when they can't."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


class ConfigError(ValueError):
    """A checkpoint's config or an engine setting is invalid; the message names what and why."""


def _positive(name: str, value: int) -> None:
    if not isinstance(value, int) or value <= 0:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")


def _positive_finite(name: str, value: Any) -> float:
    """value as a float, refused unless a finite number above zero: a norm's epsilon at or below zero (or
    NaN) makes its rsqrt blow up, so every request would fail; a string is refused, not converted."""
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not (math.isfinite(value) and value > 0)
    ):
        raise ConfigError(f"{name} must be a positive finite number, got {value!r}")
    return float(value)


def checkpoint_roots(path: str | Path) -> tuple[Path, ...]:
    """The real directories a checkpoint's files may resolve into: the checkpoint dir's own real path and,
    for a Hugging Face hub cache snapshot (<repo>/snapshots/<revision>, whose files are links to
    ../../blobs/<hash>), the repo folder that holds snapshots/ and blobs/. Files that are links elsewhere
    are refused rather than followed (vLLM and transformers follow them): a downloaded checkpoint cannot
    make ATOM read, say, a file of the user's home through its name."""
    root = Path(path).resolve()
    repo = root.parent.parent
    if root.parent.name == "snapshots" and (repo / "blobs").is_dir():
        return root, repo
    return (root,)


def outside_checkpoint(path: str | Path, file: Path) -> Path | None:
    """file's real path, when it lies outside the checkpoint's roots (checkpoint_roots); None when inside."""
    real = file.resolve()
    return None if any(real.is_relative_to(root) for root in checkpoint_roots(path)) else real


def checkpoint_file(path: Path, name: str, error: type[ValueError] = ConfigError) -> Path:
    """path / name, refused with `error` (naming it) when it is a link whose target is outside the
    checkpoint (checkpoint_roots)."""
    file = path / name
    if (real := outside_checkpoint(path, file)) is not None:
        raise error(
            f"{file} is a link to {real}, outside the checkpoint dir: ATOM reads no such file (copy it "
            "into the dir, or give --model a dir that holds it)"
        )
    return file


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding parameters: rope_type is default, linear, dynamic, llama3 or yarn."""

    theta: float = 10000.0
    rope_type: str = "default"
    factor: float = 1.0
    original_max_position: int | None = None
    low_freq_factor: float = 1.0  # llama3
    high_freq_factor: float = 4.0  # llama3
    beta_fast: float = 32.0  # yarn
    beta_slow: float = 1.0  # yarn
    attention_factor: float | None = None  # yarn (None: from factor, mscale and mscale_all_dim)
    mscale: float | None = None  # yarn
    mscale_all_dim: float | None = None  # yarn
    truncate: bool = True  # yarn: round the correction range to whole dims
    partial_rotary_factor: float = 1.0
    # multimodal rotary (Qwen3.5): frequencies per position row T, H, W; taken by [3, T] positions
    mrope_section: tuple[int, ...] | None = None
    mrope_interleaved: bool = False

    SUPPORTED = ("default", "linear", "dynamic", "llama3", "yarn")

    def __post_init__(self):
        if self.rope_type not in self.SUPPORTED:
            raise ConfigError(
                f"rope type {self.rope_type!r} is not supported (supported: {', '.join(self.SUPPORTED)})"
            )
        if self.factor <= 0 or self.theta <= 0 or not 0 < self.partial_rotary_factor <= 1:
            raise ConfigError("rope theta and factor must be positive and partial_rotary_factor in (0, 1]")

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> RopeConfig:
        """From config.json: transformers 5's rope_parameters, or the older rope_scaling + rope_theta."""
        params = dict(hf.get("rope_parameters") or hf.get("rope_scaling") or {})
        theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
        rope_type = params.get("rope_type", params.get("type", "default"))
        original = params.get("original_max_position_embeddings")
        factor = params.get("factor")
        if factor is None and rope_type == "yarn" and original:  # transformers: the context's growth
            factor = hf.get("max_position_embeddings", original) / original
        return cls(
            theta=float(theta),
            rope_type=rope_type,
            factor=float(1.0 if factor is None else factor),
            original_max_position=original,
            low_freq_factor=float(params.get("low_freq_factor", 1.0)),
            high_freq_factor=float(params.get("high_freq_factor", 4.0)),
            beta_fast=float(params.get("beta_fast") or 32.0),
            beta_slow=float(params.get("beta_slow") or 1.0),
            attention_factor=params.get("attention_factor"),
            mscale=params.get("mscale"),
            mscale_all_dim=params.get("mscale_all_dim"),
            truncate=bool(params.get("truncate", True)),
            partial_rotary_factor=float(
                params.get("partial_rotary_factor", hf.get("partial_rotary_factor", 1.0))
            ),
            mrope_section=tuple(params["mrope_section"]) if params.get("mrope_section") else None,
            mrope_interleaved=bool(params.get("mrope_interleaved", False)),
        )


def text_model_config(hf: dict[str, Any]) -> dict[str, Any]:
    """A multimodal checkpoint's language model (Qwen3.5's *ForConditionalGeneration): its text_config's
    fields over the top level's (architectures, dtype and quantization stay the top level's); other configs
    unchanged. `vision_config` stays, so a model knows its checkpoint also carries a vision tower."""
    text = hf.get("text_config")
    if not isinstance(text, dict):
        return hf
    merged = {**{k: v for k, v in hf.items() if k != "text_config"}, **text}
    for key in ("architectures", "quantization_config", "torch_dtype", "dtype"):
        if key in hf:
            merged[key] = hf[key]
    return merged


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The model-side facts ATOM needs, read from an HF checkpoint dir (config.json)."""

    path: Path | None
    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    max_position_embeddings: int
    rms_norm_eps: float
    rope: RopeConfig
    tie_word_embeddings: bool
    attention_bias: bool
    dtype: torch.dtype
    hidden_act: str = "silu"
    hf: dict[str, Any] = field(repr=False, default_factory=dict)  # the raw config, for family extras
    generation: dict[str, Any] = field(repr=False, default_factory=dict)  # generation_config.json, if any

    SUPPORTED_ACTIVATIONS = ("silu",)

    def __post_init__(self):
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "max_position_embeddings",
        ):
            _positive(name, getattr(self, name))
        _positive_finite("rms_norm_eps", self.rms_norm_eps)
        if self.num_attention_heads % self.num_key_value_heads:
            raise ConfigError(
                f"num_attention_heads ({self.num_attention_heads}) must be a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.hidden_act not in self.SUPPORTED_ACTIVATIONS:
            raise ConfigError(
                f"hidden_act {self.hidden_act!r} is not supported (ATOM's MLPs compute "
                f"{', '.join(self.SUPPORTED_ACTIVATIONS)})"
            )

    @classmethod
    def from_pretrained(cls, path: str | Path, dtype: str | torch.dtype = "auto") -> ModelConfig:
        path = Path(path)
        config_file = checkpoint_file(path, "config.json")
        if not config_file.is_file():
            raise ConfigError(f"{path} is not a checkpoint dir: no config.json")
        try:
            hf = json.loads(config_file.read_text())
        except json.JSONDecodeError as err:
            raise ConfigError(f"{config_file} is not valid JSON: {err}") from None
        if not isinstance(hf, dict):
            raise ConfigError(f"{config_file} is not a JSON object")
        generation_file = checkpoint_file(path, "generation_config.json")
        try:
            generation = json.loads(generation_file.read_text()) if generation_file.is_file() else {}
        except json.JSONDecodeError as err:
            raise ConfigError(f"{generation_file} is not valid JSON: {err}") from None
        return cls.from_hf_dict(hf, path=path, dtype=dtype, generation=generation)

    @classmethod
    def from_hf_dict(
        cls,
        hf: dict[str, Any],
        *,
        path: Path | None = None,
        dtype: str | torch.dtype = "auto",
        generation: dict[str, Any] | None = None,
    ):
        archs = hf.get("architectures") or []
        if not archs:
            raise ConfigError('config.json names no architecture ("architectures" is missing)')
        hf = text_model_config(hf)
        from atom_core.registry import SPECS

        if (spec := SPECS.get(archs[0])) is not None:
            hf = spec.with_defaults(hf)
        missing = [
            k
            for k in ("vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads")
            if k not in hf
        ]
        if missing:
            from atom_core.registry import get_model_spec

            get_model_spec(archs[0])  # an architecture ATOM has no model for says so (GPT-2's n_embd...)
            raise ConfigError(f"config.json lacks {', '.join(missing)}")
        for name in ("hidden_size", "num_attention_heads"):  # divided by below
            _positive(name, hf[name])
        heads = hf["num_attention_heads"]
        head_dim = hf.get("head_dim") or hf["hidden_size"] // heads
        return cls(
            path=path,
            architecture=archs[0],
            vocab_size=hf["vocab_size"],
            hidden_size=hf["hidden_size"],
            intermediate_size=hf.get("intermediate_size", 4 * hf["hidden_size"]),
            num_hidden_layers=hf["num_hidden_layers"],
            num_attention_heads=heads,
            num_key_value_heads=hf.get("num_key_value_heads") or heads,
            head_dim=head_dim,
            max_position_embeddings=hf.get("max_position_embeddings", 2048),
            rms_norm_eps=_positive_finite("rms_norm_eps", hf.get("rms_norm_eps", 1e-6)),
            rope=RopeConfig.from_hf(hf),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            attention_bias=bool(hf.get("attention_bias", False)),
            dtype=resolve_dtype(dtype, hf),
            hidden_act=hf.get("hidden_act", "silu"),
            hf=hf,
            generation=generation or {},
        )


def resolve_dtype(dtype: str | torch.dtype, hf: dict[str, Any]) -> torch.dtype:
    """ "auto": the checkpoint's dtype (float32 if it names none); else the named dtype."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype == "auto":
        dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    if dtype not in _DTYPES:
        raise ConfigError(f"dtype {dtype!r} is not one of {', '.join(_DTYPES)} or 'auto'")
    return _DTYPES[dtype]


@dataclass(frozen=True, slots=True)
class CacheConfig:
    """Paged KV cache: block size, layout (flash or shuffle) and dtype ("auto": the model's, or "fp8")."""

    block_size: int = 16
    layout: str = "flash"
    kv_dtype: str = "auto"
    num_blocks: int | None = None  # None: sized from free memory by the engine

    def __post_init__(self):
        _positive("block_size", self.block_size)
        if self.layout not in ("flash", "shuffle"):
            raise ConfigError(f"KV layout must be 'flash' or 'shuffle', got {self.layout!r}")
        if self.kv_dtype not in ("auto", "fp8"):
            raise ConfigError(f"kv_dtype must be 'auto' or 'fp8', got {self.kv_dtype!r}")
        if self.num_blocks is not None:
            _positive("num_blocks", self.num_blocks)


@dataclass(frozen=True, slots=True)
class ParallelConfig:
    """Tensor parallelism: this process's rank among tp_size, and the process group to reduce over."""

    tp_size: int = 1
    tp_rank: int = 0
    group: Any = None  # a torch.distributed ProcessGroup when tp_size > 1
    # the engine's all-reduce for small messages over peer memory (engine/execution/peer_all_reduce.py); None: NCCL
    peer_all_reduce: Any = None

    def __post_init__(self):
        _positive("tp_size", self.tp_size)
        if not 0 <= self.tp_rank < self.tp_size:
            raise ConfigError(f"tp_rank {self.tp_rank} is outside [0, {self.tp_size})")
