"""Block-quantized fp8 checkpoints (DeepSeek-V3, Qwen3-Next-FP8, Qwen3.5-FP8): config and linear method.

config.json: `quantization_config = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
"weight_block_size": [bm, bn], "modules_to_not_convert": [...]}`. A quantized linear stores `weight`
e4m3 [out, in] and `weight_scale_inv` [ceil(out/bm), ceil(in/bn)], the dequantization multiplier.

Under tensor parallel a rank's rows (or columns) may start inside a checkpoint block, and packed layers
put several tensors' rows side by side; each linear keeps its scales in the coarsest grid whose groups
fall within one checkpoint block and one piece (`local_block`), so no scale is ever averaged or guessed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from atom_core.config import ConfigError
from atom_core.ops import dequantize_fp8_weight, fp8_linear
from atom_core.quantization.unquantized import UnquantizedLinearMethod

E4M3 = torch.float8_e4m3fn
SUPPORTED_KEYS = {"quant_method", "fmt", "activation_scheme", "weight_block_size", "modules_to_not_convert"}
# transformers' FineGrainedFP8Config writes these with their defaults; other values are refused
NEUTRAL = {"dequantize": (False, None), "modules_to_convert": (None, [], ()), "scale_fmt": (None, "float")}
SCALE_FMTS = (None, "float", "ue8m0")  # ue8m0 (DeepSeek-V3.1): activation scales rounded up to powers of two


@dataclass(frozen=True, slots=True)
class Fp8BlockConfig:
    """The checkpoint's fp8 format; `linear_method(prefix)` says which linears hold fp8 weights."""

    block: tuple[int, int]
    modules_to_not_convert: tuple[str, ...] = ()
    pow2_act_scales: bool = False
    name: str = "fp8"

    @classmethod
    def from_hf(cls, architecture: str, declared: dict) -> Fp8BlockConfig:
        """Validates config.json's quantization_config; anything ATOM does not implement is refused by name."""
        where = f"{architecture}: quantization_config"
        fmt = declared.get("fmt", "e4m3")
        if fmt != "e4m3":
            raise ConfigError(f"{where} fmt {fmt!r} is not supported (ATOM loads fp8 e4m3)")
        scheme = declared.get("activation_scheme", "dynamic")
        if scheme != "dynamic":
            raise ConfigError(
                f"{where} activation_scheme {scheme!r} is not supported (ATOM quantizes activations "
                "dynamically, per token and block: 'dynamic')"
            )
        block = declared.get("weight_block_size")
        if not (isinstance(block, list | tuple) and len(block) == 2 and all(_positive_int(b) for b in block)):
            raise ConfigError(
                f"{where} weight_block_size {block!r} is not supported: ATOM loads block-quantized fp8 "
                "with weight_block_size [rows, cols] (per-tensor fp8 scales are not supported)"
            )
        scale_fmt = declared.get("scale_fmt")
        if scale_fmt not in SCALE_FMTS:
            raise ConfigError(
                f"{where} scale_fmt {scale_fmt!r} is not supported (supported: 'float', 'ue8m0' or none)"
            )
        for key in ("dequantize", "modules_to_convert"):
            if declared.get(key) not in NEUTRAL[key]:
                raise ConfigError(
                    f"{where} {key}={declared[key]!r} is not supported (ATOM loads the fp8 weights as they "
                    f"are, every projection not in modules_to_not_convert; {key} may only be "
                    f"{' or '.join(map(repr, NEUTRAL[key]))})"
                )
        unknown = sorted(set(declared) - SUPPORTED_KEYS - set(NEUTRAL))
        if unknown:
            raise ConfigError(
                f"{where} has {', '.join(map(repr, unknown))}, which ATOM does not implement "
                f"(it reads {', '.join(sorted(SUPPORTED_KEYS | set(NEUTRAL)))})"
            )
        skip = declared.get("modules_to_not_convert") or ()
        return cls(
            block=(int(block[0]), int(block[1])),
            modules_to_not_convert=tuple(_text_module(m) for m in skip),
            pow2_act_scales=scale_fmt == "ue8m0",
        )

    def is_skipped(self, prefix: str, packed_from: tuple[str, ...] = ()) -> bool:
        """Whether the module at `prefix` stays unquantized (modules_to_not_convert names it or a parent).
        A packed module (qkv_proj) is checked by its checkpoint modules, which must agree."""
        if not packed_from:
            return any(_names(entry, prefix) for entry in self.modules_to_not_convert)
        parent = prefix.rsplit(".", 1)[0]
        skipped = [self.is_skipped(f"{parent}.{name}") for name in packed_from]
        if any(skipped) and not all(skipped):
            raise ConfigError(
                f"quantization_config.modules_to_not_convert lists some of {prefix}'s packed modules "
                f"({', '.join(packed_from)}) but not all: ATOM loads them as one fp8 or unquantized matmul"
            )
        return all(skipped)

    def linear_method(self, prefix: str, packed_from: tuple[str, ...] = ()):
        if self.is_skipped(prefix, packed_from):
            return UnquantizedLinearMethod()
        return Fp8BlockLinearMethod(self.block, self.pow2_act_scales)

    def experts_block(self, prefix: str) -> tuple[int, int] | None:
        """The block of the stacked experts at `prefix` (".../mlp.experts"), None if unquantized."""
        return None if self.is_skipped(prefix) else self.block

    def experts_mxfp4(self, prefix: str) -> bool:
        return False


def is_kernel_group(cols: int) -> bool:
    """Whether the fp8 kernels take scale groups of `cols` input columns (one per k-step)."""
    return cols >= 16 and cols & (cols - 1) == 0


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _text_module(name: str) -> str:
    """Multimodal checkpoints name their language model's modules model.language_model.*; ATOM's text
    model has them as model.*."""
    return name.replace("model.language_model.", "model.", 1)


def _names(entry: str, prefix: str) -> bool:
    """entry names the module at prefix or one of its parents ("lm_head", "model.layers.3.mlp", "mtp"),
    also where an engine's wrapper puts the model under an attribute ("atom.model.layers.3..."): whole
    dotted components, anywhere in the path. Regex entries and per-expert entries are not understood;
    a checkpoint that relies on them fails the loader's format check, naming the tensor."""
    return f".{entry}." in f".{prefix}."


def local_block(pieces, col_start: int, block: tuple[int, int]) -> tuple[int, int]:
    """The scale grid a rank keeps: rows per scale row and columns per scale column.

    A group of rows must stay inside one checkpoint block and one piece; each piece but the last may end
    anywhere inside a block, so its size divides the group too. The columns start at col_start."""
    ordered = sorted(pieces, key=lambda p: p.dst)
    rows = math.gcd(block[0], *(v for p in ordered for v in (p.dst, p.src)), *(p.size for p in ordered[:-1]))
    return rows, math.gcd(block[1], col_start)


class Fp8BlockLinearMethod:
    """e4m3 weight [out_local, in_local] and fp32 `weight_scale_inv` in the layer's local grid
    (`layer.scale_block`); the product is atom-kernels' fp8_linear (weight-streaming at decode's few rows,
    W8A8 beyond, the dequantized weight on the CPU)."""

    name = "fp8"

    def __init__(self, block: tuple[int, int], pow2_act_scales: bool):
        self.block, self.pow2_act_scales = block, pow2_act_scales

    def create_weights(self, layer: nn.Module, in_local: int, out_local: int, dtype: torch.dtype) -> None:
        pieces = [p for shard in layer.shard_ids() for p in layer.row_pieces(shard)[1]]
        col_start = layer.col_range()[1]
        layer.scale_block = local_block(pieces, col_start, self.block)
        if not is_kernel_group(layer.scale_block[1]):
            raise ValueError(
                f"{layer.prefix}: this rank's input columns start at {col_start}, inside a {self.block[1]}-wide "
                f"scale block, which leaves {layer.scale_block[1]}-wide groups; the fp8 kernels quantize "
                "activations in groups of a power of two >= 16 (choose another tensor-parallel size)"
            )
        grid = (math.ceil(out_local / layer.scale_block[0]), math.ceil(in_local / layer.scale_block[1]))
        layer.weight = nn.Parameter(torch.empty(out_local, in_local, dtype=E4M3), requires_grad=False)
        layer.weight_scale_inv = nn.Parameter(torch.empty(grid, dtype=torch.float32), requires_grad=False)
        layer.weight_scale_inv.block_scale = True
        layer.dense_dtype = dtype
        for param in (layer.weight, layer.weight_scale_inv):
            param.weight_loader = layer.weight_loader

    def load_scale(self, layer, param, loaded: torch.Tensor, rows: int, pieces) -> None:
        """loaded: the checkpoint's scale grid [ceil(rows/bm), ceil(cols/bn)] -> this rank's grid."""
        cols, col_start, col_size = layer.col_range()
        check_grid(loaded, rows, cols, self.block)
        per_row = layer.scale_block[0]
        for p in pieces:
            local = regrid(loaded, self.block, layer.scale_block, (p.src, p.size), (col_start, col_size))
            param.data.narrow(0, p.dst // per_row, local.shape[0]).copy_(local)

    def apply(self, layer: nn.Module, x: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
        return fp8_linear(
            x, layer.weight, layer.weight_scale_inv, layer.scale_block, bias, pow2_scales=self.pow2_act_scales
        )

    def apply_silu_and_mul(self, layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
        """x: [T, 2 * in_local] (gate | up) -> layer(silu(gate) * up): on the W8A8 paths the activation is
        formed inside x's quantization (one read of gate_up, no [T, in_local] tensor in between)."""
        return fp8_linear(
            x,
            layer.weight,
            layer.weight_scale_inv,
            layer.scale_block,
            pow2_scales=self.pow2_act_scales,
            gated_input=True,
        )

    def process_weights_after_loading(self, layer: nn.Module) -> None:
        """Layers that also multiply by the plain matrix (MLA's absorbed kv_b_proj) set `keep_dense_weight`:
        they get it dequantized once, in the model's dtype."""
        if getattr(layer, "keep_dense_weight", False):
            layer.dense_weight = dequantize_fp8_weight(
                layer.weight, layer.weight_scale_inv, layer.scale_block, layer.dense_dtype
            )

    def dense(self, layer: nn.Module) -> torch.Tensor:
        """The [out_local, in_local] matrix in the model's dtype (kept at load time: keep_dense_weight)."""
        if not hasattr(layer, "dense_weight"):
            raise RuntimeError(
                f"{layer.prefix}: set keep_dense_weight before loading to multiply by its matrix"
            )
        return layer.dense_weight


def check_grid(loaded: torch.Tensor, rows: int, cols: int, block: tuple[int, int]) -> None:
    want = (math.ceil(rows / block[0]), math.ceil(cols / block[1]))
    if tuple(loaded.shape) != want:
        raise ValueError(
            f"expected a block scale of shape {want} ([{rows}, {cols}] in {list(block)} blocks), "
            f"got {tuple(loaded.shape)}"
        )


def regrid(
    loaded: torch.Tensor,
    block: tuple[int, int],
    local: tuple[int, int],
    rows: tuple[int, int],
    cols: tuple[int, int],
) -> torch.Tensor:
    """The scales of a checkpoint grid (in `block` tiles) for rows (start, count) and cols (start, count)
    of its tensor, in `local` tiles (each dividing the checkpoint's and starting on one of its own)."""
    fine = loaded.float().repeat_interleave(block[0] // local[0], 0)
    fine = fine.repeat_interleave(block[1] // local[1], 1)
    (r0, nr), (c0, nc) = rows, cols
    return fine[
        r0 // local[0] : math.ceil((r0 + nr) / local[0]), c0 // local[1] : math.ceil((c0 + nc) / local[1])
    ]
