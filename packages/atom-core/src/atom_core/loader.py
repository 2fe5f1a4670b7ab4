"""Checkpoint loading: HF safetensors dirs (single file or sharded with an index), streamed tensor by tensor."""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from torch import nn

from atom_core.build import BuildContext
from atom_core.config import ConfigError, ModelConfig, checkpoint_file, outside_checkpoint
from atom_core.layers.joint_linear import JointLinears
from atom_core.models.weights import FP8_DTYPES
from atom_core.quantization import quant_config_for
from atom_core.registry import get_model_spec
from atom_kernels import settings as kernel_settings
from atom_kernels.settings import Backend, resolve_backend

INDEX = "model.safetensors.index.json"


class CheckpointError(ValueError):
    """The checkpoint does not match the model; the message names the tensors."""


def checkpoint_files(path: str | Path) -> list[Path]:
    """The checkpoint's safetensors files: the shards its index's weight_map names, else every
    *.safetensors in it. Each must lie inside the checkpoint (config.checkpoint_roots: its dir, or the hub
    cache repo of a snapshot); a link out of it is refused, not followed."""
    path = Path(path)
    index = checkpoint_file(path, INDEX, CheckpointError)
    if index.is_file():
        weight_map = _weight_map(index)
        outside = sorted({f for f in weight_map.values() if outside_checkpoint(path, path / f) is not None})
        if outside:  # never read files the checkpoint does not contain
            raise CheckpointError(f"{index} points outside the checkpoint dir: {', '.join(outside)}")
        files = sorted({path / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index.name} lists shards that are not there: {', '.join(missing)}")
        return files
    files = [checkpoint_file(path, f.name, CheckpointError) for f in sorted(path.glob("*.safetensors"))]
    if not files:
        pickled = sorted(p.name for p in path.glob("*.bin"))
        hint = (
            f" (found {', '.join(pickled)}: ATOM never unpickles weights; convert them to safetensors)"
            if pickled
            else ""
        )
        raise CheckpointError(f"no .safetensors files in {path}{hint}")
    return files


def _weight_map(index: Path) -> dict[str, str]:
    """The index's weight_map, tensor name -> shard file name; any other shape is refused, naming it (a
    list would otherwise fail deep inside with a traceback)."""
    try:
        content = json.loads(index.read_text())
    except json.JSONDecodeError as err:
        raise CheckpointError(f"{index} is not a valid index: {err}") from None
    if not isinstance(content, dict):
        raise CheckpointError(f"{index} is {_json_kind(content)}, not a JSON object with a weight_map")
    if "weight_map" not in content:
        raise CheckpointError(f"{index} has no weight_map (tensor name -> shard file)")
    weight_map = content["weight_map"]
    if not isinstance(weight_map, dict):
        raise CheckpointError(
            f"{index}: weight_map is {_json_kind(weight_map)}, not a mapping of tensor name -> shard file"
        )
    if not weight_map:
        raise CheckpointError(f"{index}: weight_map is empty, so it names no shard file")
    for name, file in weight_map.items():  # JSON keys are strings already
        if not isinstance(file, str) or not file:
            raise CheckpointError(f"{index}: weight_map maps {name!r} to {file!r}, not to a shard file name")
    return weight_map


def _json_kind(value) -> str:
    kinds = {list: "a list", str: "a string", int: "a number", float: "a number", bool: "a boolean"}
    return "null" if value is None else kinds.get(type(value), type(value).__name__)


def iter_checkpoint(path: str | Path) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, tensor) for every tensor of the checkpoint, one at a time."""
    yield from _iter_files(checkpoint_files(path))


def _iter_files(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    for file in files:
        try:
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                    yield name, f.get_tensor(name)
        except (SafetensorError, OSError) as err:
            raise CheckpointError(f"{file} is not a readable safetensors file: {err}") from None


def build_model(config: ModelConfig, ctx: BuildContext, prefix: str = "") -> nn.Module:
    """The ATOM model for config.architecture, built on ctx.device with ctx's attention backend and parallel setup.

    prefix: where the model sits in its caller's module tree (e.g. "atom." inside an adapter's wrapper); its
    attention layers' AttentionLayerSpec.prefix is then that module path.
    """
    spec = get_model_spec(config.architecture)
    spec.attention_kinds(config)  # asserts the class builds only the kinds its spec declares
    return _build(spec.load_class(), config, ctx, prefix)


def build_draft(
    config: ModelConfig, ctx: BuildContext, target: nn.Module | None, prefix: str = ""
) -> nn.Module:
    """The speculative draft made of the checkpoint's MTP layers (ModelSpec.draft_class), sharing the target's
    embedding and head; built with its own BuildContext, its caches are its own (cache indices from 0).
    target None: the caller binds one later (`draft.bind_target(t)`; t has embed_input_ids and
    compute_logits), as engines that hand the shared modules over after building do."""
    draft = _build(draft_class_for(config), config, ctx, prefix)
    if target is not None:
        draft.bind_target(target)
    return draft


def draft_class_for(config: ModelConfig) -> type:
    """The draft class of config's architecture, its config checked (cheap: call it before loading a target
    that could not be speculated with). Raises ConfigError naming what is missing."""
    draft_class = get_model_spec(config.architecture).load_draft_class()
    if draft_class is None:
        from atom_core.registry import SPECS

        with_draft = [arch for arch, spec in SPECS.items() if spec.draft_class is not None]
        raise ConfigError(
            f"{config.architecture} has no MTP draft in ATOM: speculative method 'mtp' is supported for "
            f"{', '.join(with_draft)}"
        )
    draft_class.check_config(config)
    return draft_class


def _build(model_class: type, config: ModelConfig, ctx: BuildContext, prefix: str) -> nn.Module:
    kinds = model_class.layer_kinds(config)
    missing = sorted(set(kinds) - set(ctx.attention_backend.layer_kinds))
    if missing:
        raise ConfigError(
            f"{config.architecture} has {', '.join(missing)} layers, which the {ctx.attention_backend.name!r} "
            f"attention backend cannot build (it builds {', '.join(sorted(ctx.attention_backend.layer_kinds))})"
        )
    _check_kernel_backend(ctx)
    ctx = replace(ctx, quant_config=ctx.quant_config or quant_config_for(config))
    device = torch.device(ctx.device)
    available = available_memory(device)  # before the build takes its share
    try:
        with device:
            model = model_class(config, ctx, prefix).eval()
    except RuntimeError:  # an allocation that failed: when the weights cannot fit, say so instead
        with torch.device("meta"):  # the same model without storage, for its sizes
            try:
                too_big = _too_big(model_class(config, ctx, prefix), config, device, available)
            except Exception:  # no sizes to tell: the build's own error stands
                too_big = None
        if too_big is None:
            raise
        raise ConfigError(too_big) from None
    # The CPU hands out memory it does not have (overcommit), and the process is killed when loading
    # touches it: checked after the build, which touched little of it.
    if device.type == "cpu" and (too_big := _too_big(model, config, device, available)) is not None:
        raise ConfigError(too_big)
    return model


# Why a kernel backend atom-kernels refuses on a device cannot run there (resolve_backend decides).
_CANNOT_RUN = {
    Backend.TRITON: "Triton compiles for GPUs (the CPU runs only its interpreter, with TRITON_INTERPRET=1 "
    "set before start)",
    Backend.AITER: "aiter is AMD's ROCm kernel library, and no atom-kernels op has an aiter "
    "implementation yet",
}


def _check_kernel_backend(ctx: BuildContext) -> None:
    """A kernel backend the device cannot run is refused before the weights load (atom-kernels would raise
    at the first forward, a traceback after the loading), naming the device and the backends it runs."""
    device = torch.device(ctx.device)
    asked = getattr(ctx.attention_backend, "kernel_backend", None)  # an engine's own backend has none
    if device.type not in ("cpu", "cuda") or _runs(asked, device):
        return
    chosen = Backend(asked) if asked is not None else kernel_settings.SETTINGS.default_backend
    named = f"kernel_backend {asked!r}" if asked is not None else f"ATOM_KERNELS_BACKEND={chosen.value}"
    runs = ", ".join(b.value for b in Backend if _runs(b, device))
    raise ConfigError(
        f"{named} cannot run on {device.type}: {_CANNOT_RUN.get(chosen, 'atom-kernels refuses it there')}; "
        f"what runs on {device.type}: {runs}"
    )


def _runs(backend: str | None, device: torch.device) -> bool:
    try:
        resolve_backend(backend, device)
    except RuntimeError:
        return False
    return True


def available_memory(device: torch.device) -> int | None:
    """Bytes the weights may take on device: the GPU's free memory (with what this process's allocator
    holds unused), or the host's available memory and free swap (/proc/meminfo's MemAvailable counts
    the page cache it can drop); None where unknown."""
    if device.type == "cuda" and torch.cuda.is_available():
        free, _ = torch.cuda.mem_get_info(device)
        return free + torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if device.type != "cpu":
        return None
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        return (int(info["MemAvailable"].split()[0]) + int(info["SwapFree"].split()[0])) * 1024
    except (OSError, KeyError, ValueError):
        return None


def _too_big(
    model: nn.Module, config: ModelConfig, device: torch.device, available: int | None
) -> str | None:
    """Why the model's weights cannot fit `available` bytes, naming what they need, and the largest
    tensor and the config field behind it when that one alone cannot; None when they fit."""
    tensors = {id(t): (n, t) for n, t in [*model.named_parameters(), *model.named_buffers()]}.values()
    need = sum(_nbytes(t) for _, t in tensors)
    if available is None or need <= available:
        return None
    message = (
        f"{config.architecture}'s weights need {_bytes(need)} on {device}, "
        f"but {_bytes(available)} are available"
    )
    name, largest = max(tensors, key=lambda nt: _nbytes(nt[1]))
    if _nbytes(largest) > available:  # one tensor past the whole device: a config field is absurd
        shape = " x ".join(map(str, largest.shape))
        fields = [f"{k} {v}" for k, v in config.hf.items() if type(v) is int and v == max(largest.shape)]
        source = f", from config.json's {' or '.join(fields)}" if fields else ""
        message += f": {name} alone is {shape} {largest.dtype} ({_bytes(_nbytes(largest))}){source}"
    return message


def parameter_bytes(*models: nn.Module | None) -> int:
    """Bytes of the models' parameters on this process, each storage counted once (a draft shares its
    target's embedding and head)."""
    seen: dict[int, int] = {}
    for model in models:
        for param in model.parameters() if model is not None else ():
            seen[param.data_ptr()] = _nbytes(param)
    return sum(seen.values())


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _bytes(n: float) -> str:
    """n bytes in the largest binary unit it reaches."""
    units = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")
    i = 0
    while n >= 1024 and i < len(units) - 1:
        n, i = n / 1024, i + 1
    return f"{n} B" if i == 0 else f"{n:.1f} {units[i]}"


def load_checkpoint(
    model: nn.Module, path: str | Path | None, *, load_format: str = "safetensors", seed: int = 0
) -> None:
    """Fill the model's weights from an HF checkpoint dir, or with random values (load_format="dummy")."""
    if load_format == "dummy":  # filled where the parameters live: fast even for billions of values
        generators: dict[torch.device, torch.Generator] = {}
        for param in model.parameters():
            gen = generators.setdefault(param.device, torch.Generator(device=param.device).manual_seed(seed))
            _fill_dummy(param, gen)
        finish_loading(model)
        return
    if load_format != "safetensors":
        raise CheckpointError(f"load_format must be 'safetensors' or 'dummy', got {load_format!r}")
    if path is None:
        raise CheckpointError("load_format='safetensors' needs a checkpoint path")
    files = checkpoint_files(path)  # before touching the model: a dir without safetensors fails here
    filled = model.load_weights(_iter_files(files))
    missing = sorted(set(dict(model.named_parameters())) - filled)
    if missing:
        shown = ", ".join(missing[:8]) + (f" and {len(missing) - 8} more" if len(missing) > 8 else "")
        raise CheckpointError(f"checkpoint {path} is missing tensors for: {shown}")
    _check_finite(model, path)
    finish_loading(model)


E8M0_DUMMY = 127 - 7  # dummy MXFP4 weights' scale byte: 2**-7


def _fill_dummy(param: nn.Parameter, gen: torch.Generator) -> None:
    """Uniform in [-0.05, 0.05]; fp8 weights as e4m3 values over the whole range with block scales of
    0.05 / 448, so they dequantize to the same spread; MXFP4 bytes as random codes with scales of 2**-7
    (at most 6 * 2**-7 ~ 0.047)."""
    if getattr(param, "block_scale", False):
        param.data.fill_(0.05 / 448)
    elif getattr(param, "e8m0_scale", False):
        param.data.fill_(E8M0_DUMMY)
    elif param.dtype == torch.uint8:  # MXFP4 bytes: two e2m1 codes each
        param.data.random_(0, 256, generator=gen)
    elif param.dtype in FP8_DTYPES:
        flat = param.data.view(-1)
        for start in range(0, flat.numel(), 1 << 26):  # e4m3 has no uniform_: drawn in bf16 slices
            part = flat[start : start + (1 << 26)]
            part.copy_(
                torch.empty(part.shape, dtype=torch.bfloat16, device=part.device).uniform_(
                    -448, 448, generator=gen
                )
            )
    else:
        param.data.uniform_(-0.05, 0.05, generator=gen)


def finish_loading(model: nn.Module) -> None:
    """Each linear's weight method finishes its weights once all are loaded, then the linears a layer runs
    as one matmul are joined (layers/joint_linear.py). Engines that load weights themselves call this after
    their own loading."""
    for module in model.modules():
        if (method := getattr(module, "quant_method", None)) is not None:
            method.process_weights_after_loading(module)
    for module in model.modules():
        for value in vars(module).values():
            if isinstance(value, JointLinears):
                value.join()


def _check_finite(model: nn.Module, path) -> None:
    """NaN or Inf in a weight would make every answer garbage: name the first such parameter (one
    reduction per parameter, where it lives: cheap on a GPU, a pass over memory on the CPU)."""
    for name, param in model.named_parameters():
        if (
            param.dtype == torch.float8_e4m3fn
        ):  # no isfinite for fp8; e4m3fn's only non-finite is NaN, s1111111
            finite = not bool(((param.view(torch.uint8) & 0x7F) == 0x7F).any())
        elif param.dtype in FP8_DTYPES:
            finite = bool(torch.isfinite(param.float()).all())
        else:
            finite = not param.is_floating_point() or bool(torch.isfinite(param).all())
        if not finite:
            raise CheckpointError(f"checkpoint {path}: {name} holds NaN or Inf values")
