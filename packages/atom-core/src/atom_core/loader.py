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
from atom_core.config import ConfigError, ModelConfig
from atom_core.models.weights import FP8_DTYPES
from atom_core.quantization import quant_config_for
from atom_core.registry import get_model_spec


class CheckpointError(ValueError):
    """The checkpoint does not match the model; the message names the tensors."""


def checkpoint_files(path: str | Path) -> list[Path]:
    path = Path(path)
    index = path / "model.safetensors.index.json"
    if index.is_file():
        try:
            weight_map = json.loads(index.read_text()).get("weight_map", {})
        except (json.JSONDecodeError, AttributeError) as err:
            raise CheckpointError(f"{index} is not a valid index: {err}") from None
        root = path.resolve()
        outside = sorted({f for f in weight_map.values() if not (path / f).resolve().is_relative_to(root)})
        if outside:  # never read files the checkpoint does not contain
            raise CheckpointError(f"{index} points outside the checkpoint dir: {', '.join(outside)}")
        files = sorted({path / f for f in weight_map.values()})
        missing = [f.name for f in files if not f.is_file()]
        if missing:
            raise CheckpointError(f"{index.name} lists shards that are not there: {', '.join(missing)}")
        return files
    files = sorted(path.glob("*.safetensors"))
    if not files:
        pickled = sorted(p.name for p in path.glob("*.bin"))
        hint = (
            f" (found {', '.join(pickled)}: ATOM never unpickles weights; convert them to safetensors)"
            if pickled
            else ""
        )
        raise CheckpointError(f"no .safetensors files in {path}{hint}")
    return files


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
    ctx = replace(ctx, quant_config=ctx.quant_config or quant_config_for(config))
    with torch.device(ctx.device):
        return model_class(config, ctx, prefix).eval()


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


def _fill_dummy(param: nn.Parameter, gen: torch.Generator) -> None:
    """Uniform in [-0.05, 0.05]; fp8 weights as e4m3 values over the whole range with block scales of
    0.05 / 448, so they dequantize to the same spread."""
    if getattr(param, "block_scale", False):
        param.data.fill_(0.05 / 448)
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
    """Each linear's weight method finishes its weights once all are loaded (engines that load weights
    themselves call this after their own loading)."""
    for module in model.modules():
        if (method := getattr(module, "quant_method", None)) is not None:
            method.process_weights_after_loading(module)


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
