"""What atom-sglang's tests share: tiny configs of every architecture ATOM serves, random checkpoints
(no model hub: built here) and transformers' logits as the reference.

pytest imports test files with --import-mode=importlib, so conftest.py puts this directory on sys.path and
tests import this module as `sglang_support`. The checkpoint_for fixture built on it is in conftest.py.
"""

from pathlib import Path

import torch

from tools.testing_models import (  # noqa: F401 (re-exported)
    DEEPSEEK_V2_TINY,
    DEEPSEEK_V3_TINY,
    TINY_ARCHITECTURES,
    TINY_DIMS,
    config_class_name,
    decisive_routing,
    random_checkpoint,
)

# Every architecture's tiny model (tools/testing_models.py), with this suite's vocabulary.
TINY = dict(TINY_DIMS, vocab_size=300)
ARCHITECTURES = TINY_ARCHITECTURES


def tiny_config(architecture: str, **overrides):
    """The transformers config of `architecture`'s tiny model (overrides change it, e.g. to add windows)."""
    import transformers

    return getattr(transformers, config_class_name(architecture))(
        **{**TINY, **ARCHITECTURES[architecture], **overrides}
    )


def transformers_logits(checkpoint: Path, tokens: list[int]) -> torch.Tensor:
    """transformers' logits at every position of one sequence, [len(tokens), vocab] (fp32)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0]
