"""atom-sglang: the SGLang plugin that runs ATOM's models and attention inside SGLang.

SGLang finds it through the `sglang.srt.plugins` entry point `atom` -> `atom_sglang.plugin:register`,
and finds ATOM's model wrappers through SGLANG_EXTERNAL_MODEL_PACKAGE=atom_sglang.models.
Importing this package is cheap: it imports neither SGLang nor torch.
"""

__version__ = "0.1.0"

# The SGLang releases this adapter is built and tested against (checked again at registration).
SUPPORTED_SGLANG = ">=0.5.23,<0.5.24"

# What users set so SGLang's model registry scans ATOM's wrappers.
EXTERNAL_MODEL_PACKAGE = "atom_sglang.models"

__all__ = ["EXTERNAL_MODEL_PACKAGE", "SUPPORTED_SGLANG", "__version__"]
