"""The MTP draft vLLM's speculative decoding instantiates for ATOM's targets: atom-core's MTP layer inside
vLLM's draft contract.

vLLM renames the draft's architecture (DeepSeek-V3's becomes "DeepSeekMTPModel") and looks it up in its
model registry, where the plugin points it here. After building and loading the draft, vLLM's proposer
hands it the target's embedding (`draft.model.embed_tokens`) and head (`draft.lm_head`); the draft binds
to those on its first forward. It returns (hidden for the logits, hidden for the next draft step), the
tuple vLLM expects from "DeepSeekMTPModel"; both are the MTP layer's output after shared_head.norm, which
ATOM's head reads and ATOM's draft chains on.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from atom_core.integration import finish_loading
from atom_vllm.model import ATOM_PREFIX, build_atom
from atom_vllm.registration import DRAFTS

logger = logging.getLogger("vllm.atom_vllm")


class SharedTarget:
    """What ATOM's draft reads from its target: the embedding and head vLLM shared with the draft."""

    def __init__(self, embed_tokens: nn.Module, lm_head: nn.Module):
        self.embed_tokens, self.lm_head = embed_tokens, lm_head

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head.logits(hidden)


class AtomMTPDraft(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        hf_config = vllm_config.model_config.hf_config
        # vLLM's draft config names the draft architecture or still the target's (hf_overrides vary)
        [architecture] = hf_config.architectures
        target = DRAFTS.get(architecture, architecture)
        if target not in DRAFTS.values():
            raise NotImplementedError(
                f"ATOM drafts for {', '.join(DRAFTS.values())} under vLLM; got draft architecture {architecture!r}"
            )
        self.atom, _ = build_atom(vllm_config, prefix, draft_of=target)
        self.config = hf_config
        self.lm_head: nn.Module | None = None  # the target's, set by vLLM's proposer
        logger.info("ATOM MTP draft %s drafts for %s", type(self.atom).__name__, target)

    @property
    def model(self) -> nn.Module:
        """The draft's module tree (vLLM puts the target's embed_tokens in it)."""
        return self.atom.model

    def _bind(self) -> None:
        if not self.atom._target:
            embed = getattr(self.atom.model, "embed_tokens", None)
            if embed is None or self.lm_head is None:
                raise RuntimeError("vLLM did not share the target's embedding and head with ATOM's MTP draft")
            self.atom.bind_target(SharedTarget(embed, self.lm_head))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        self._bind()
        return self.atom._target[0].embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
        spec_step_idx: int = 0,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """input_ids, positions: [T]; hidden_states: [T, H] (the target's, or the draft's previous step)
        -> (hidden for compute_logits, hidden for the next step), both [T, H]."""
        if inputs_embeds is not None or intermediate_tensors is not None:
            raise NotImplementedError(
                "ATOM's MTP draft takes token ids (no input embeddings, no pipeline parallel)"
            )
        self._bind()
        hidden = self.atom(input_ids, positions, hidden_states)
        return hidden, hidden

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        self._bind()
        return self.atom.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        filled = self.atom.load_weights(weights)
        finish_loading(self.atom)
        return {f"{ATOM_PREFIX}.{name}" for name in filled}
