"""Per-layer weight formats: a linear asks its model's QuantConfig for the method that owns its weights.

The format is the checkpoint's (config.json's `quantization_config`), decided per layer by its module path
(`prefix`), never by a global mode: unquantized, block-quantized fp8 (quant_method "fp8"), or MXFP4
experts (quant_method "mxfp4"); other formats are refused by name.
"""

from atom_core.quantization.base import LinearMethod, QuantConfig, quant_config_for
from atom_core.quantization.fp8 import Fp8BlockConfig, Fp8BlockLinearMethod
from atom_core.quantization.mxfp4 import Mxfp4Config
from atom_core.quantization.unquantized import UNQUANTIZED, Unquantized, UnquantizedLinearMethod

__all__ = [
    "UNQUANTIZED",
    "Fp8BlockConfig",
    "Fp8BlockLinearMethod",
    "LinearMethod",
    "Mxfp4Config",
    "QuantConfig",
    "Unquantized",
    "UnquantizedLinearMethod",
    "quant_config_for",
]
