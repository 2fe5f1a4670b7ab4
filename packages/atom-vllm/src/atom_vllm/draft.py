"""The MTP draft vLLM's speculative decoding instantiates for ATOM's targets: atom-core's MTP layer inside
vLLM's draft contract.

vLLM renames the draft's architecture (DeepSeek-V3's becomes "DeepSeekMTPModel", Qwen3-Next's
"Qwen3NextMTP", Qwen3.5's "Qwen3_5MTP" / "Qwen3_5MoeMTP") and looks it up in its model registry, where the
plugin points it here. After building and loading the draft, vLLM's proposer hands it the target's
embedding (`draft.model.embed_tokens`) and head (`draft.lm_head`); the draft binds to those on its first
forward. The MTP layer's output (after its final norm) is what ATOM's head reads and what ATOM's draft
chains on; vLLM expects it as a pair (for the logits, for the next step) from the architectures in
PAIR_DRAFTS and alone from the others.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from atom_core.integration import SharedVocab, load_atom_weights
from atom_vllm.model import build_atom
from atom_vllm.registration import DRAFTS

logger = logging.getLogger("vllm.atom_vllm")

# vLLM's proposer takes (hidden for the logits, hidden for the next step) from these draft architectures
PAIR_DRAFTS = frozenset({"DeepSeekMTPModel"})


class AtomMTPDraft(nn.Module):
    def __init__(self, *, vllm_config, prefix: str = ""):
        super().__init__()
        hf_config = vllm_config.model_config.hf_config  # the target's: the MTP layer is in its checkpoint
        speculative = vllm_config.speculative_config
        draft_config = speculative.draft_model_config.hf_config if speculative is not None else hf_config
        [architecture] = draft_config.architectures  # what vLLM wrote for the draft
        target = DRAFTS.get(architecture)
        if target is None:
            raise NotImplementedError(
                f"ATOM drafts as {', '.join(DRAFTS)} under vLLM; got draft architecture {architecture!r}"
            )
        self.atom, config = build_atom(vllm_config, prefix, draft_of=target)
        self.mrope = config.rope.mrope_section is not None
        self.config = hf_config
        self.returns_pair = architecture in PAIR_DRAFTS
        self.lm_head: nn.Module | None = None  # the target's, set by vLLM's proposer
        # where vLLM puts the target's embedding when ATOM's draft has no decoder stack of its own (Qwen's)
        self.shared = nn.Module()
        logger.info("ATOM MTP draft %s drafts for %s", type(self.atom).__name__, target)

    @property
    def model(self) -> nn.Module:
        """The draft's decoder stack, or a holder: vLLM sets `model.embed_tokens` to the target's there."""
        return getattr(self.atom, "model", self.shared)

    def _bind(self) -> None:
        if self.atom.target is None:
            embed = getattr(self.model, "embed_tokens", None)
            if embed is None or self.lm_head is None:
                raise RuntimeError("vLLM did not share the target's embedding and head with ATOM's MTP draft")
            self.atom.bind_target(SharedVocab.of_modules(embed, self.lm_head))

    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        self._bind()
        return self.atom.embed_input_ids(input_ids)

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        hidden_states: torch.Tensor,
        intermediate_tensors=None,
        inputs_embeds: torch.Tensor | None = None,
        spec_step_idx: int = 0,
    ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """input_ids: [T]; positions: [T] (or [3, T] for M-RoPE targets); hidden_states: [T, H] (the
        target's, or the draft's previous step) -> the draft's hidden [T, H], or the pair (for
        compute_logits, for the next step) where vLLM expects one (PAIR_DRAFTS)."""
        if inputs_embeds is not None or intermediate_tensors is not None:
            raise NotImplementedError(
                "ATOM's MTP draft takes token ids (no input embeddings, no pipeline parallel)"
            )
        self._bind()
        if positions.dim() == 2 and not self.mrope:
            # vLLM's proposer hands M-RoPE positions [3, T] to the draft of a Qwen3.5 text model whose
            # config it stripped of M-RoPE; for text, ATOM's only input here, the three rows are equal
            positions = positions[0]
        hidden = self.atom(input_ids, positions, hidden_states)
        return (hidden, hidden) if self.returns_pair else hidden

    def compute_logits(self, hidden_states: torch.Tensor, spec_step_idx: int = 0) -> torch.Tensor:
        self._bind()
        return self.atom.compute_logits(hidden_states)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        return load_atom_weights(self.atom, weights)
