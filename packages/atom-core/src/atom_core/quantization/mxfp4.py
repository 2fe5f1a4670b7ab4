"""MXFP4 checkpoints (quant_method "mxfp4", as GPT-OSS ships): the MoE experts are e2m1 bytes with e8m0
scales per 32 values (atom_kernels.moe.mxfp4); every linear layer stays in the model's dtype, as in
transformers, whose MXFP4 support quantizes only GPT-OSS's experts.

`modules_to_not_convert` entries are module paths in which `*` stands for one path component
("model.layers.*.self_attn"); an entry names a module or any of its parents. Other forms (regular
expressions, non-strings) are refused by name.
"""

from __future__ import annotations

import fnmatch
import re
from dataclasses import dataclass

from atom_core.config import ConfigError
from atom_core.quantization.unquantized import UnquantizedLinearMethod

ARCHITECTURES = ("GptOssForCausalLM",)  # the families whose experts transformers loads from MXFP4
SUPPORTED_KEYS = frozenset({"quant_method", "modules_to_not_convert", "dequantize"})
_ENTRY = re.compile(r"^[A-Za-z0-9_*]+(\.[A-Za-z0-9_*]+)*$")  # dotted components, `*` as a wildcard


@dataclass(frozen=True, slots=True)
class Mxfp4Config:
    modules_to_not_convert: tuple[str, ...] = ()
    name: str = "mxfp4"

    @classmethod
    def from_hf(cls, architecture: str, declared: dict) -> Mxfp4Config:
        where = f"{architecture}: quantization_config"
        if architecture not in ARCHITECTURES:
            raise ConfigError(
                f"{where} quant_method 'mxfp4' is implemented for the experts of {', '.join(ARCHITECTURES)} "
                "only (as in transformers)"
            )
        unknown = sorted(set(declared) - SUPPORTED_KEYS)
        if unknown:
            raise ConfigError(
                f"{where} has {', '.join(map(repr, unknown))}, which ATOM does not implement for mxfp4 "
                f"(it reads {', '.join(sorted(SUPPORTED_KEYS))})"
            )
        # dequantize=True asks transformers for the same weights in bf16: the kernels' weight-only MXFP4
        # computes with exactly those values, so either setting loads the same way.
        if declared.get("dequantize") not in (None, False, True):
            raise ConfigError(f"{where} dequantize must be true or false, got {declared['dequantize']!r}")
        entries = declared.get("modules_to_not_convert") or ()
        if not isinstance(entries, list | tuple):
            raise ConfigError(
                f"{where} modules_to_not_convert must be a list of module paths, got {entries!r}"
            )
        for entry in entries:
            if not isinstance(entry, str) or not _ENTRY.match(entry):
                raise ConfigError(
                    f"{where} modules_to_not_convert entry {entry!r} is not supported: ATOM reads dotted "
                    "module paths in which '*' stands for one component (e.g. 'model.layers.*.self_attn')"
                )
        return cls(tuple(entries))

    def is_skipped(self, prefix: str) -> bool:
        """Whether modules_to_not_convert names the module at `prefix` or a parent of it (anywhere in the
        path, so that an engine's wrapper attribute in front of "model." does not hide it)."""
        parts = prefix.split(".")
        for entry in self.modules_to_not_convert:
            pattern = entry.split(".")
            for start in range(len(parts) - len(pattern) + 1):
                window = parts[start : start + len(pattern)]
                if all(fnmatch.fnmatchcase(p, q) for p, q in zip(window, pattern, strict=True)):
                    return True
        return False

    def linear_method(self, prefix: str, packed_from: tuple[str, ...] = ()) -> UnquantizedLinearMethod:
        return UnquantizedLinearMethod()

    def experts_block(self, prefix: str) -> None:
        return None

    def experts_mxfp4(self, prefix: str) -> bool:
        """The stacked experts at `prefix` (".../mlp.experts") are MXFP4 unless listed as not converted."""
        return not self.is_skipped(prefix)
