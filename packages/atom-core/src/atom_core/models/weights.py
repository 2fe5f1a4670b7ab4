"""Checkpoint names -> parameters, driven by data: packed-module rules and per-family name rules.

A rule maps a checkpoint tensor to (parameter name, shard id). Each parameter declares the shards it
needs (`expected_shards`, default {None}); a parameter counts as loaded once all its shards arrived.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2)


class WeightLoadError(ValueError):
    """A checkpoint tensor could not be loaded; the message names the tensor and why."""


@dataclass(frozen=True, slots=True)
class PackedRule:
    """Checkpoint names containing `source` load into the parameter named with `target` instead, as `shard`."""

    source: str
    target: str
    shard: Any


NameRule = Callable[[str], tuple[str, Any] | None]  # checkpoint name -> (parameter name, shard) or None


@dataclass(frozen=True, slots=True)
class Covering:
    """A shard id for one tensor that fills several of a parameter's expected shards at once (a checkpoint
    that stores all experts in one tensor): `shards` counts as loaded, `id` goes to the weight loader."""

    id: Any
    shards: frozenset


GATE_UP_PACKED = (
    PackedRule(".gate_proj.", ".gate_up_proj.", 0),
    PackedRule(".up_proj.", ".gate_up_proj.", 1),
)
LLAMA_PACKED = (
    PackedRule(".q_proj.", ".qkv_proj.", "q"),
    PackedRule(".k_proj.", ".qkv_proj.", "k"),
    PackedRule(".v_proj.", ".qkv_proj.", "v"),
    *GATE_UP_PACKED,
)


def load_by_rules(
    model: nn.Module,
    weights: Iterable[tuple[str, torch.Tensor]],
    packed: Sequence[PackedRule],
    *,
    name_rules: Sequence[NameRule] = (),
    skip: Callable[[str], bool] = lambda name: False,
) -> set[str]:
    """Load `weights` into `model`; returns the names of the parameters that got all their shards.

    Raises WeightLoadError for a tensor the model has no place for, or one whose shape is wrong.
    """
    params = dict(model.named_parameters())
    filled: dict[str, set] = defaultdict(set)
    unexpected = []
    for name, tensor in weights:
        if skip(name):
            continue
        target, shard = _resolve(name, packed, name_rules)
        param = params.get(target)
        if param is None:
            unexpected.append(name)
            continue
        _check_format(name, tensor, target, param)
        loader = getattr(param, "weight_loader", None)
        try:
            if loader is None:
                if tuple(tensor.shape) != tuple(param.shape):
                    raise ValueError(f"expected shape {tuple(param.shape)}, got {tuple(tensor.shape)}")
                param.data.copy_(tensor)
            else:
                shard_id = shard.id if isinstance(shard, Covering) else shard
                loader(param, tensor.to(param.dtype), shard_id) if shard is not None else loader(
                    param, tensor.to(param.dtype)
                )
        except ValueError as err:
            raise WeightLoadError(f"checkpoint tensor {name!r} does not fit {target!r}: {err}") from None
        filled[target].update(shard.shards) if isinstance(shard, Covering) else filled[target].add(shard)
    if unexpected:
        shown = ", ".join(unexpected[:8]) + (
            f" and {len(unexpected) - 8} more" if len(unexpected) > 8 else ""
        )
        scales = [n for n in unexpected if n.endswith("weight_scale_inv")]
        hint = (
            f" ({scales[0]} is an fp8 block scale for a module this model holds unquantized: the checkpoint's "
            "quantization_config lists it in modules_to_not_convert, or declares no fp8 quantization)"
            if scales
            else ""
        )
        raise WeightLoadError(f"checkpoint has tensors this model has no place for: {shown}{hint}")
    return {n for n, got in filled.items() if got >= getattr(params[n], "expected_shards", frozenset({None}))}


def _check_format(name: str, tensor: torch.Tensor, target: str, param: nn.Parameter) -> None:
    """An fp8 tensor goes only into an fp8 parameter of its own format, and back: a cast would drop its
    scale (or saturate e5m2's range into e4m3's). An integer or bool tensor never goes into a floating one:
    a cast would make weights of its codes (an integer quantization ATOM does not load, or a broken file)."""
    if not param.is_floating_point() and tensor.dtype != param.dtype:  # codes (MXFP4 bytes, e8m0 scales)
        raise WeightLoadError(
            f"checkpoint tensor {name!r} is {tensor.dtype}, where {target!r} holds {param.dtype} codes (MXFP4 "
            "blocks and scales are uint8; an unquantized checkpoint declares no mxfp4 quantization_config)"
        )
    if param.is_floating_point() and not tensor.is_floating_point():
        into = "" if target == name else f" of {target!r}"
        raise WeightLoadError(
            f"checkpoint tensor {name!r} is {tensor.dtype}, where a floating-point weight{into} "
            f"({param.dtype}) belongs: ATOM loads no integer-quantized weights and casts no codes into weights"
        )
    if tensor.dtype == param.dtype or (tensor.dtype not in FP8_DTYPES and param.dtype not in FP8_DTYPES):
        return
    if tensor.dtype in FP8_DTYPES and param.dtype in FP8_DTYPES:
        raise WeightLoadError(f"checkpoint tensor {name!r} is {tensor.dtype}; {target!r} holds {param.dtype}")
    if tensor.dtype in FP8_DTYPES:
        raise WeightLoadError(
            f"checkpoint tensor {name!r} is {tensor.dtype}, but {target!r} is unquantized in this model (its "
            "module is in quantization_config.modules_to_not_convert, or config.json declares no fp8 "
            "quantization_config)"
        )
    raise WeightLoadError(
        f"checkpoint tensor {name!r} is {tensor.dtype}, but config.json's fp8 quantization_config makes "
        f"{target!r} {param.dtype} with a weight_scale_inv: list its module in modules_to_not_convert if the "
        "checkpoint keeps it unquantized"
    )


def _resolve(name: str, packed: Sequence[PackedRule], name_rules: Sequence[NameRule]) -> tuple[str, Any]:
    for rule in name_rules:
        if (hit := rule(name)) is not None:
            return hit
    for rule in packed:
        if rule.source in name:
            return name.replace(rule.source, rule.target), rule.shard
    return name, None
