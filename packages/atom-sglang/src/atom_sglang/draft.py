"""The NextN/MTP draft SGLang's speculative (EAGLE) worker runs for ATOM's targets: atom-core's MTP model
inside SGLang's draft contract.

SGLang renames the target's architecture for its draft runner (DeepSeek-V3's becomes
"DeepseekV3ForCausalLMNextN", specs.DRAFTS) and resolves that name in its model registry, where the external
model package puts this wrapper. The draft loads its MTP layer from the target's checkpoint; SGLang's worker
then hands it the target's embedding and head (`set_embed_and_head`, the same storage), and every draft
forward reads the target's hidden states (after its final norm) from `forward_batch.spec_info`. What the
draft returns through SGLang's LogitsProcessor, its hidden after the MTP layer's final norm, is what SGLang
captures and feeds back for the next draft step, as atom-core's draft chains.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

import torch
from sglang.srt.layers.logits_processor import LogitsProcessor
from sglang.srt.runtime_context import get_parallel
from torch import nn

from atom_core.integration import ParallelConfig, SharedVocab, load_atom_weights
from atom_sglang.runtime import sglang_forward
from atom_sglang.specs import SglangModelSpec
from atom_sglang.wrapper import build_atom


class AtomDraftForCausalLM(nn.Module):
    """SGLang's NextN draft contract over atom-core's MTP draft: forward(input_ids, positions,
    forward_batch) with the target's hidden states in forward_batch.spec_info -> LogitsProcessorOutput."""

    spec: ClassVar[SglangModelSpec]

    def __init__(self, config, quant_config=None, prefix: str = ""):
        super().__init__()
        self.atom = build_atom(self.spec, config, quant_config, prefix)
        self.config = config
        self.logits_processor = LogitsProcessor(config.get_text_config())  # multimodal configs nest it
        self.vocab: SharedVocab | None = None  # the target's embedding and head, from set_embed_and_head
        self.spec.install(self)

    # -- what SGLang's EAGLE worker shares ---------------------------------------------------------------
    def set_embed_and_head(self, embed: torch.Tensor, head: torch.Tensor) -> None:
        """The target's embedding and head weights (this rank's rows), used in place, never copied."""
        if head.shape[0] != embed.shape[0]:
            raise NotImplementedError(
                f"ATOM's {self.spec.architecture} drafts over the target's whole vocabulary; SGLang handed a "
                f"head of {head.shape[0]} rows for an embedding of {embed.shape[0]} (--speculative-token-map "
                "is not supported)"
            )
        parallel = get_parallel()
        split = ParallelConfig(
            tp_size=parallel.tp_size,
            tp_rank=parallel.tp_rank,
            group=parallel.tp_group.device_group if parallel.tp_size > 1 else None,
        )
        self.vocab = SharedVocab(embed, head, self.atom.config.vocab_size, split)
        self.atom.bind_target(self.vocab)

    def get_embed_and_head(self) -> tuple[torch.Tensor, torch.Tensor]:
        vocab = self._shared()
        return vocab.embed_tokens.weight, vocab.lm_head.weight

    def get_input_embeddings(self) -> nn.Module:
        return self._shared().embed_tokens

    def _shared(self) -> SharedVocab:
        if self.vocab is None:
            raise RuntimeError(
                f"ATOM's {self.spec.architecture} runs on its target's embedding and head: SGLang's "
                "speculative worker hands them over with set_embed_and_head before the first forward"
            )
        return self.vocab

    # -- SGLang's model contract -------------------------------------------------------------------------
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
        """input_ids, positions: [T]; forward_batch.spec_info.hidden_states: [T, hidden] (the target's, or
        this draft's previous step) -> SGLang's LogitsProcessorOutput."""
        if input_embeds is not None or get_embedding or pp_proxy_tensors is not None:
            raise NotImplementedError(
                "ATOM's MTP draft under SGLang takes token ids (no input embeddings, embeddings or pipeline "
                "parallelism)"
            )
        vocab = self._shared()
        if forward_batch.forward_mode.is_idle():
            hidden = torch.empty(
                0, self.atom.config.hidden_size, dtype=vocab.lm_head.weight.dtype, device=input_ids.device
            )
        else:
            target_hidden = forward_batch.spec_info.hidden_states
            with sglang_forward(forward_batch):
                hidden = self.atom(input_ids, positions, target_hidden)
        return self.logits_processor(input_ids, hidden, vocab.lm_head, forward_batch)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """The target's checkpoint (name, tensor) pairs: atom-core's draft keeps its MTP layer's."""
        return load_atom_weights(self.atom, weights)
