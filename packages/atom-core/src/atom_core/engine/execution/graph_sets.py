"""The CUDA graphs one runner captures, by the shape of forward each serves: the target's decode (one token
a sequence), its speculative verify (1 + k tokens a sequence), its prefill steps (a few sequences of any
lengths, up to a token count), and the draft's (one token: chaining; 1 + k: catching up on a verified
step)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import torch
from torch import nn

from atom_core.cache.specs import PAGED
from atom_core.engine.execution.cuda_graphs import DecodeGraphs
from atom_core.engine.execution.prefill_graphs import PrefillGraphs
from atom_core.engine.execution.step_inputs import DraftInputs, StepInputs
from atom_core.engine.plan import CachePlan


class GraphSets:
    def __init__(
        self,
        model: nn.Module,
        caches: Sequence,
        kinds: Collection[str],
        plan: CachePlan,
        *,
        device: torch.device,
        draft: nn.Module | None = None,
        draft_caches: Sequence = (),
        hidden: tuple[int, torch.dtype] | None = None,
    ):
        """hidden: (width, dtype) of the target's hidden states, which the draft reads."""
        shape = dict(
            sizes=plan.graph_sizes,
            device=device,
            max_model_len=plan.max_model_len,
            block_size=plan.block_size,
        )
        with torch.inference_mode():
            self.decode = DecodeGraphs(model, caches, kinds, **shape)
            self.prefill: PrefillGraphs | None = None
            if plan.prefill_graph_tokens:
                self.prefill = PrefillGraphs(
                    model, caches, kinds, tokens=plan.prefill_graph_tokens, seqs=plan.prefill_graph_seqs,
                    device=device, max_model_len=plan.max_model_len, block_size=plan.block_size,
                )  # fmt: skip
            self.verify: DecodeGraphs | None = None
            self.drafts: list[DecodeGraphs] = []
            if draft is not None:
                q = plan.verify_query_len
                self.verify = DecodeGraphs(model, caches, kinds, query_len=q, **shape)
                self.drafts = [
                    DecodeGraphs(draft, draft_caches, {PAGED}, query_len=n, hidden_input=hidden, **shape)
                    for n in (1, q)
                ]

    def for_step(self, inputs: StepInputs) -> DecodeGraphs | PrefillGraphs | None:
        """The graphs that replay this target step, if any."""
        sets = (self.decode, self.verify, self.prefill)
        return next((g for g in sets if g is not None and g.serves(inputs)), None)

    def for_draft(self, inputs: DraftInputs) -> DecodeGraphs | None:
        return next((g for g in self.drafts if g.serves(inputs)), None)

    def release(self) -> None:
        """Free every graph (a tensor-parallel rank must, before its NCCL group is destroyed)."""
        for graphs in (self.decode, self.verify, self.prefill, *self.drafts):
            if graphs is not None:
                graphs.release()
