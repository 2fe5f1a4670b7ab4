"""The quantization seam: what a linear's weight method does, and how a model's config picks one per layer."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import torch

from atom_core.config import ConfigError, ModelConfig

if TYPE_CHECKING:
    from torch import nn


class LinearMethod(Protocol):
    """Owns a linear layer's weight tensors: creates them, multiplies with them, finishes them after loading."""

    name: str

    def create_weights(self, layer: nn.Module, in_local: int, out_local: int, dtype: torch.dtype) -> None:
        """Register the layer's weight parameters (each with `weight_loader = layer.weight_loader`)."""
        ...

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        """x: [T, in_local] -> [T, out_local]."""
        ...

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Once every tensor is loaded: repack or convert for the kernels (a no-op where none is needed)."""
        ...

    def dense(self, layer: nn.Module) -> torch.Tensor:
        """The layer's [out_local, in_local] matrix in the model's dtype (MLA absorbs kv_b_proj's)."""
        ...


class QuantConfig(Protocol):
    name: str

    def linear_method(self, prefix: str, packed_from: tuple[str, ...] = ()) -> LinearMethod:
        """The method for the linear at module path `prefix` (e.g. "model.layers.3.self_attn.qkv_proj"),
        which packs the checkpoint modules `packed_from` (q_proj, k_proj, v_proj) if any."""
        ...

    def experts_block(self, prefix: str) -> tuple[int, int] | None:
        """The fp8 block of the stacked experts at `prefix` (".../mlp.experts"), or None: unquantized."""
        ...

    def experts_mxfp4(self, prefix: str) -> bool:
        """Whether the stacked experts at `prefix` are MXFP4 (e2m1 bytes, e8m0 scales per 32 values)."""
        ...


def quant_config_for(config: ModelConfig) -> QuantConfig:
    """The weight format config.json declares; a declared format ATOM does not implement is refused."""
    from atom_core.quantization.fp8 import Fp8BlockConfig
    from atom_core.quantization.unquantized import UNQUANTIZED

    declared = config.hf.get("quantization_config")
    if not declared:
        return UNQUANTIZED
    method = declared.get("quant_method") if isinstance(declared, dict) else declared
    if method == "fp8":
        return Fp8BlockConfig.from_hf(config.architecture, declared)
    if method == "mxfp4":
        from atom_core.quantization.mxfp4 import Mxfp4Config

        return Mxfp4Config.from_hf(config.architecture, declared)
    raise ConfigError(
        f"{config.architecture}: quantization_config quant_method {method!r} is not supported "
        "(ATOM loads unquantized checkpoints, block-quantized 'fp8' and 'mxfp4' experts)"
    )
