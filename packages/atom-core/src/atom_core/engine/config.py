"""EngineConfig: every option of the native engine in one slotted dataclass, shared by `LLM`, `LLMEngine`,
the model runner and every `atom` subcommand (as vLLM's EngineArgs: add_cli_args / from_cli_args)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # this module stays cheap to import: the CLI builds its parser from it
    import torch

    from atom_core.config import CacheConfig

from atom_core.engine.speculative_config import SpeculativeConfig

LOAD_FORMATS = ("safetensors", "dummy")
KERNEL_BACKENDS = ("triton", "torch")  # (aiter, atom-kernels' ROCm name, has no op yet: refused by name)
STATE_CACHE_DTYPES = ("float32", "bfloat16")


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """The scheduler's limits per step: sequences running at once, and tokens computed."""

    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192

    def __post_init__(self):
        if self.max_num_seqs < 1 or self.max_num_batched_tokens < 1:
            raise ValueError("max_num_seqs and max_num_batched_tokens must be at least 1")


@dataclass(frozen=True, slots=True)
class EngineConfig:
    model: str | Path | None = None  # HF checkpoint dir; None: the built-in demo checkpoint
    dtype: str = "auto"  # auto (the checkpoint's), float32, float16 or bfloat16
    load_format: str = "safetensors"  # or dummy: random weights of the checkpoint's shapes
    max_model_len: int | None = None  # None: the model's max_position_embeddings (lowered to fit the cache)
    tensor_parallel_size: int = 1
    block_size: int = 16  # tokens per KV page
    num_kv_blocks: int | None = None  # None: as many as gpu_memory_utilization (or 1 GiB on the CPU) holds
    kv_cache_dtype: str = "auto"  # auto (the model's) or fp8
    kv_layout: str = "flash"  # flash or shuffle
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    device: str | None = None  # cpu or cuda; None: cuda if available
    kernel_backend: str | None = None  # triton or torch; None: atom-kernels decides per device
    # the share of the GPU's total memory this engine may use, weights and KV cache together (vLLM's meaning):
    # it must be free when the engine starts, and the KV cache takes what the weights leave of it (unused when
    # num_kv_blocks sizes the cache)
    gpu_memory_utilization: float = 0.9
    enforce_eager: bool = False  # no CUDA graphs (the CPU is always eager)
    # the most tokens a prefill step replayed from a CUDA graph has (steps of up to 8 sequences, prefill
    # chunks and decodes mixed; captured at powers of two from 16); 0: prefill steps run eagerly
    max_prefill_graph_tokens: int = 512
    disable_custom_all_reduce: bool = (
        False  # tensor parallel: NCCL for every all-reduce (no peer-memory kernel)
    )
    # {"method": "mtp", "num_speculative_tokens": k} (or its JSON): the checkpoint's MTP layer drafts k tokens
    speculative_config: SpeculativeConfig | dict | str | None = None
    # models with state layers (GDN): states kept at block boundaries for prefix caching; each takes one
    # sequence's state memory (0: no prefix caching for them); None: max_num_seqs
    state_snapshots: int | None = None
    state_cache_dtype: str = "float32"  # GDN recurrent state: float32 (as transformers) or bfloat16
    # launch step k+1 before reading step k's tokens, which are sampled on the device
    # (engine/steps/async_step.py), so the host's work between steps overlaps the GPU's; None: on for CUDA
    async_scheduling: bool | None = None
    # sampling defaults for fields a request leaves unset (engine/generation_defaults.py): "auto", the
    # checkpoint's generation_config.json; "vllm", none; or a directory holding a generation_config.json
    generation_config: str = "auto"
    tokenizer: str | Path | None = None  # a tokenizer dir other than the checkpoint's (vLLM's `tokenizer`)
    # the chat template (a file, or the Jinja text itself) in place of the tokenizer's own, or for one that
    # has none
    chat_template: str | Path | None = None
    # seeds every request that brings no seed of its own (one generator an engine): a run repeats its
    # sampled output; None: torch's global generator (torch.manual_seed repeats a run)
    seed: int | None = None
    enable_prefix_caching: bool | None = None  # None: on where the model allows it; False: off

    def __post_init__(self):
        from atom_core.config import ConfigError

        if isinstance(self.tensor_parallel_size, bool) or not isinstance(self.tensor_parallel_size, int):
            raise ConfigError(f"tensor_parallel_size must be an integer, got {self.tensor_parallel_size!r}")
        if self.tensor_parallel_size < 1:
            raise ConfigError("tensor_parallel_size must be at least 1")
        if self.load_format not in LOAD_FORMATS:
            raise ConfigError(
                f"load_format must be one of {', '.join(LOAD_FORMATS)}, got {self.load_format!r}"
            )
        if self.kernel_backend == "aiter":
            raise ConfigError(
                "kernel_backend 'aiter': no atom-kernels op has an aiter (ROCm) implementation yet; "
                f"choose one of {', '.join(KERNEL_BACKENDS)}, or None (by device)"
            )
        if self.kernel_backend is not None and self.kernel_backend not in KERNEL_BACKENDS:
            raise ConfigError(
                f"kernel_backend must be one of {', '.join(KERNEL_BACKENDS)} or None, got {self.kernel_backend!r}"
            )
        if not 0 < self.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"gpu_memory_utilization must be in (0, 1], got {self.gpu_memory_utilization!r}"
            )
        if self.device is not None and str(self.device).split(":")[0] not in ("cpu", "cuda"):
            raise ConfigError(f"device must be cpu or cuda, got {self.device!r}")
        if self.state_cache_dtype not in STATE_CACHE_DTYPES:
            raise ConfigError(
                f"state_cache_dtype must be one of {', '.join(STATE_CACHE_DTYPES)}, got {self.state_cache_dtype!r}"
            )
        if (
            isinstance(self.max_prefill_graph_tokens, bool)
            or not isinstance(self.max_prefill_graph_tokens, int)
            or self.max_prefill_graph_tokens < 0
        ):
            raise ConfigError(
                f"max_prefill_graph_tokens must be a non-negative integer, got {self.max_prefill_graph_tokens!r}"
            )
        if self.state_snapshots is not None and (
            isinstance(self.state_snapshots, bool)
            or not isinstance(self.state_snapshots, int)
            or self.state_snapshots < 0
        ):
            raise ConfigError(f"state_snapshots must be a non-negative integer, got {self.state_snapshots!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        if self.max_model_len is not None and (
            isinstance(self.max_model_len, bool)
            or not isinstance(self.max_model_len, int)
            or self.max_model_len < 1
        ):
            raise ConfigError(f"max_model_len must be a positive integer, got {self.max_model_len!r}")
        if self.async_scheduling not in (None, True, False):
            raise ConfigError(f"async_scheduling must be True, False or None, got {self.async_scheduling!r}")
        try:
            object.__setattr__(self, "speculative_config", SpeculativeConfig.parse(self.speculative_config))
        except ValueError as err:
            raise ConfigError(str(err)) from None
        self.cache_config()  # their own checks, now rather than at the first step
        self.scheduler_config()

    def cache_config(self) -> CacheConfig:
        from atom_core.config import CacheConfig

        return CacheConfig(
            block_size=self.block_size,
            layout=self.kv_layout,
            kv_dtype=self.kv_cache_dtype,
            num_blocks=self.num_kv_blocks,
        )

    def scheduler_config(self) -> SchedulerConfig:

        return SchedulerConfig(self.max_num_seqs, self.max_num_batched_tokens)

    def async_scheduling_on(self) -> bool:
        """async_scheduling as asked, or by device when not asked (the device's kind only: torch_device()
        checks that it is there)."""
        if self.async_scheduling is not None:
            return self.async_scheduling
        if self.device is not None:
            return str(self.device).split(":")[0] == "cuda"
        import torch

        return torch.cuda.is_available()

    def torch_device(self) -> torch.device:
        """The device asked for (None: cuda if torch sees a GPU, else cpu), refused by name where torch
        cannot see it (devices.py)."""
        from atom_core.engine.devices import resolve_device

        return resolve_device(self.device)

    @staticmethod
    def add_cli_args(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        """Every engine option as a flag (--max-model-len, ...), defaults from the dataclass."""
        d = argparse.Namespace(**{f.name: f.default for f in fields(EngineConfig)})  # slots hide the defaults
        group = parser.add_argument_group("engine")
        group.add_argument(
            "--model", type=Path, default=None, help="HF checkpoint dir; default: built-in demo"
        )
        group.add_argument(
            "--dtype",
            default=d.dtype,
            choices=["auto", "float32", "float16", "bfloat16"],
            help="weights' and activations' dtype (auto: the checkpoint's torch_dtype)",
        )
        group.add_argument(
            "--load-format",
            default=d.load_format,
            choices=LOAD_FORMATS,
            help="dummy: random weights at the checkpoint's shapes (benchmarks), no weight files read",
        )
        group.add_argument("--max-model-len", type=int, default=None, help="default: the model's limit")
        group.add_argument(
            "--tensor-parallel-size",
            type=int,
            default=d.tensor_parallel_size,
            help="GPUs the model is split over",
        )
        group.add_argument("--block-size", type=int, default=d.block_size, help="tokens per KV page")
        group.add_argument("--num-kv-blocks", type=int, default=None, help="default: sized from free memory")
        group.add_argument(
            "--kv-cache-dtype",
            default=d.kv_cache_dtype,
            choices=["auto", "fp8"],
            help="auto: the model's dtype; fp8: e4m3 with per-tensor scales",
        )
        group.add_argument(
            "--kv-layout",
            default=d.kv_layout,
            choices=["flash", "shuffle"],
            help="the paged KV cache's memory layout (shuffle: the one AMD's decode kernels read)",
        )
        group.add_argument(
            "--max-num-seqs", type=int, default=d.max_num_seqs, help="sequences running at once, at most"
        )
        group.add_argument(
            "--max-num-batched-tokens",
            type=int,
            default=d.max_num_batched_tokens,
            help="tokens one step computes, at most (longer prompts are prefilled in chunks)",
        )
        group.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
        group.add_argument(
            "--kernel-backend", default=None, choices=KERNEL_BACKENDS, help="default: by device"
        )
        group.add_argument(
            "--gpu-memory-utilization",
            type=float,
            default=d.gpu_memory_utilization,
            help="share of the GPU's total memory the engine may use, weights and KV cache together "
            "(as vLLM's); the KV cache takes what is left",
        )
        group.add_argument("--enforce-eager", action="store_true", help="no CUDA graphs")
        group.add_argument(
            "--max-prefill-graph-tokens",
            type=int,
            default=d.max_prefill_graph_tokens,
            help="the most tokens a prefill step replayed from a CUDA graph has (0: prefill runs eagerly)",
        )
        group.add_argument(
            "--disable-custom-all-reduce",
            action="store_true",
            help="tensor parallel: NCCL for every all-reduce, not the peer-memory kernel for small ones",
        )
        group.add_argument(
            "--state-snapshots",
            type=int,
            default=None,
            help="GDN models: states kept for prefix caching (0: none; default: max-num-seqs)",
        )
        group.add_argument(
            "--state-cache-dtype",
            default=d.state_cache_dtype,
            choices=STATE_CACHE_DTYPES,
            help="GDN models: the recurrent state's dtype",
        )
        group.add_argument(
            "--async-scheduling",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="launch each step before the last one's tokens reach the host (default: on for CUDA)",
        )
        group.add_argument(
            "--generation-config",
            default=d.generation_config,
            help="sampling defaults for what a request leaves unset: auto (the checkpoint's "
            "generation_config.json, as vLLM), vllm (none), or a directory holding one",
        )
        group.add_argument(
            "--tokenizer", type=Path, default=None, help="a tokenizer dir (default: the model's)"
        )
        group.add_argument(
            "--chat-template",
            default=None,
            help="a chat template file, or the Jinja text itself (default: the tokenizer's own)",
        )
        group.add_argument(
            "--seed",
            type=int,
            default=None,
            help="seeds every request that gives no seed of its own: sampled output repeats run to run",
        )
        group.add_argument(
            "--enable-prefix-caching",
            action=argparse.BooleanOptionalAction,
            default=None,
            help="reuse the KV cache of prompts' shared prefixes (default: on where the model allows it)",
        )
        group.add_argument(
            "--speculative-config",
            default=None,
            help='JSON, e.g. \'{"method": "mtp", "num_speculative_tokens": 2}\' (the checkpoint\'s MTP layer drafts)',
        )
        return parser

    @classmethod
    def from_cli_args(cls, args: argparse.Namespace, **overrides) -> EngineConfig:
        """The config a parsed command line asks for; overrides: fields a subcommand sets itself."""
        values = {f.name: getattr(args, f.name) for f in fields(cls)}
        return cls(**{**values, **overrides})
