"""The model SGLang instantiates for every architecture ATOM supports: an atom-core model inside SGLang's
model contract, built with RadixAttention layers and SGLang's tensor-parallel group.

SGLang's registry keys model classes by class name, so each architecture gets a subclass named after it
(`entry_class`); all behaviour lives here and per-architecture needs come from specs.py.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from pathlib import Path
from typing import ClassVar

import torch
from sglang.srt.configs.model_config import is_multimodal_model
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.runtime_context import get_parallel
from torch import nn

from atom_core.integration import atom_module_prefix, build_for_engine, load_atom_weights
from atom_sglang.attention.layer import CoreAttentionBackend
from atom_sglang.runtime import sglang_forward
from atom_sglang.specs import SglangModelSpec, adapter_spec

logger = logging.getLogger("atom_sglang")


# read from config.json by atom-core: block-quantized e4m3 (DeepSeek-V3's format), MXFP4 experts (GPT-OSS's)
ATOM_QUANT_METHODS = ("fp8", "mxfp4")
SGLANG_ADDED_KEYS = ("packed_modules_mapping",)  # SGLang writes these into quantization_config


def checkpoint_config(hf: dict, quant_config, architecture: str) -> dict:
    """The checkpoint's config as atom-core reads it. SGLang parses quantization_config into its own
    QuantizationConfig and hands it to the model; ATOM's layers read the same checkpoint fields themselves,
    so SGLang's object is only checked to name a method ATOM implements."""
    if quant_config is None:
        return hf
    name = quant_config.get_name()
    declared = hf.get("quantization_config") or {}
    if name not in ATOM_QUANT_METHODS or declared.get("quant_method") != name:
        raise NotImplementedError(
            f"ATOM's {architecture} under SGLang loads unquantized, block-quantized fp8 and mxfp4 checkpoints; SGLang "
            f"chose quantization {name!r} (config.json's quant_method: {declared.get('quant_method')!r})"
        )
    own = {k: v for k, v in declared.items() if k not in SGLANG_ADDED_KEYS}
    return {**hf, "quantization_config": own}


def checkpoint_fields(config) -> dict:
    """The model's config as atom-core reads it: the checkpoint's config.json, with SGLang's architecture
    name (SGLang renames a draft's) and the user's --json-model-override-args on top. Not SGLang's config
    object itself: its own classes fill fields the checkpoint does not have with their defaults (MoE
    fields on a dense Qwen3.5) and drop ones they predate (transformers 5's `rope_parameters` and
    `layer_types`). Without a config.json (a config built in memory) SGLang's dict is all there is."""
    from sglang.srt.runtime_context import get_model

    fields = saved_config(config)
    if not fields:
        return config.to_dict()
    fields["architectures"] = list(config.architectures)
    overrides = json.loads(get_model().json_model_override_args or "{}")
    return _merged(fields, overrides)


def saved_config(config) -> dict:
    """The checkpoint's config.json ({} if SGLang's config was not read from a directory)."""
    path = Path(getattr(config, "_name_or_path", "") or "") / "config.json"
    return json.loads(path.read_text()) if path.is_file() else {}


def draft_target(spec: SglangModelSpec, config) -> str | None:
    """A draft's target architecture: the one the checkpoint's config.json names (SGLang rewrote it)."""
    if spec.role != "draft":
        return None
    saved = (saved_config(config).get("architectures") or [None])[0]
    if saved in spec.draft_of:
        return saved
    if len(spec.draft_of) == 1:
        return spec.draft_of[0]
    raise NotImplementedError(
        f"ATOM's {spec.architecture} drafts for {', '.join(spec.draft_of)}; the checkpoint's config.json "
        f"names {saved!r}"
    )


def _merged(base: dict, overrides: dict) -> dict:
    """SGLang's override semantics: nested dicts (text_config) merge key by key."""
    out = dict(base)
    for key, value in overrides.items():
        out[key] = (
            _merged(out[key], value) if isinstance(out.get(key), dict) and isinstance(value, dict) else value
        )
    return out


def build_atom(spec: SglangModelSpec, config, quant_config, prefix: str) -> nn.Module:
    """The unloaded atom-core model (a draft's MTP model for role "draft") SGLang's loader instantiates,
    with SGLang's tensor-parallel group, default dtype and device."""
    hf_config = checkpoint_config(checkpoint_fields(config), quant_config, spec.architecture)
    parallel = get_parallel()
    tp_size = parallel.tp_size
    atom, _ = build_for_engine(
        spec.prepare_config(hf_config),
        attention_backend=CoreAttentionBackend(spec.layer_id),
        dtype=torch.get_default_dtype(),
        device=torch.get_default_device(),  # both set by SGLang's loader
        tp_size=tp_size,
        tp_rank=parallel.tp_rank,
        tp_group=parallel.tp_group.device_group if tp_size > 1 else None,
        prefix=atom_module_prefix(prefix),
        draft_of=draft_target(spec, config),
    )
    logger.info(
        "ATOM model %s.%s runs %s as %s (tp %d/%d)",
        type(atom).__module__,
        type(atom).__name__,
        spec.architecture,
        spec.role,
        parallel.tp_rank,
        tp_size,
    )
    return atom


def refuse_media_serving(config, architecture: str) -> None:
    """ATOM's models take text. For an architecture SGLang lists as multimodal, SGLang builds a media
    processor and hands encoded images to the model unless it runs with --language-model-only; with that
    flag its TokenizerManager answers a request carrying media with a 400 and keeps serving. So the flag is
    required, and its absence is refused when the model is built, not when the first image arrives."""
    if is_multimodal_model(config.architectures) and not getattr(config, "language_model_only", False):
        raise ValueError(
            f"ATOM's {architecture} under SGLang serves text only: launch with --language-model-only "
            "(SGLang then answers requests carrying images, video or audio with a 400)"
        )


class AtomForCausalLM(nn.Module):
    """SGLang's causal-LM contract over an atom-core model: forward(input_ids, positions, forward_batch)
    returns SGLang's LogitsProcessorOutput (logprobs, extend pruning and TP gathering are SGLang's)."""

    spec: ClassVar[SglangModelSpec]

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        refuse_media_serving(config, self.spec.architecture)
        self.atom = build_atom(self.spec, config, quant_config, prefix)
        self.config = config
        self.logits_processor = LogitsProcessor(config.get_text_config())  # multimodal configs nest it
        self.spec.install(self)

    def get_input_embeddings(self) -> nn.Module:
        return self.atom.model.embed_tokens

    def get_embed_and_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        """What SGLang's EAGLE worker shares between a target and its draft."""
        return self.atom.model.embed_tokens.weight, self.atom.lm_head.weight

    @torch.no_grad()
    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        forward_batch,
        input_embeds: torch.Tensor | None = None,
        get_embedding: bool = False,
        pp_proxy_tensors=None,
    ):
        """input_ids, positions: [T] -> SGLang's LogitsProcessorOutput for the batch's sampled positions."""
        if get_embedding or pp_proxy_tensors is not None:
            raise NotImplementedError(
                "ATOM models under SGLang generate; no embeddings or pipeline parallelism"
            )
        if forward_batch.mm_inputs is not None and forward_batch.contains_mm_inputs():
            # unreachable under --language-model-only (refuse_media_serving); kept so nothing is dropped
            raise NotImplementedError(
                f"ATOM's {self.spec.architecture} under SGLang is served text-only; this batch carries image, "
                "video or audio inputs"
            )
        if forward_batch.forward_mode.is_idle():  # no tokens on this rank: nothing to run
            hidden = torch.empty(
                0, self.atom.config.hidden_size, dtype=self.atom.lm_head.weight.dtype, device=input_ids.device
            )
        else:
            with sglang_forward(forward_batch):
                hidden = self.atom(input_ids, positions, inputs_embeds=input_embeds)
        return self.logits_processor(input_ids, hidden, self.atom.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Checkpoint (name, tensor) pairs -> the names of this module's parameters that were filled."""
        cut = self.spec.checkpoint_prefix
        mine = ((name[len(cut) :], tensor) for name, tensor in weights if name.startswith(cut))
        return load_atom_weights(self.atom, mine)


def entry_class(architecture: str) -> type[nn.Module]:
    """The wrapper (AtomForCausalLM, or AtomDraftForCausalLM for a draft) under the architecture's name, as
    SGLang's registry needs."""
    from atom_sglang.draft import AtomDraftForCausalLM

    spec = adapter_spec(architecture)
    base = AtomDraftForCausalLM if spec.role == "draft" else AtomForCausalLM
    namespace = {"spec": spec, "__module__": "atom_sglang.models.atom", "__qualname__": architecture}
    return type(architecture, (base,), namespace)
