"""atom-vllm: the vLLM plugin that runs ATOM's models and attention inside vLLM.

vLLM finds it through the `vllm.general_plugins` entry point `atom` -> `atom_vllm.plugin:register`.
Importing this package is cheap: it imports neither vLLM nor torch.
"""

__version__ = "0.1.0"

# The vLLM releases this adapter is built and tested against (checked again at registration).
SUPPORTED_VLLM = ">=0.32.0,<0.33"

__all__ = ["SUPPORTED_VLLM", "__version__"]
