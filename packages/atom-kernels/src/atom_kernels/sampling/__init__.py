"""Sampling kernels: the greedy token of each row and whether the row is finite, in one launch; sampled
tokens drawn with a 64-bit key per row (temperature, top-k, top-p, min-p) without a sort; speculative
drafts' acceptance counted on the device."""

from atom_kernels.sampling.accept import accepted_drafts, accepted_drafts_ref
from atom_kernels.sampling.greedy import greedy_tokens, greedy_tokens_ref
from atom_kernels.sampling.keyed_draw import keyed_draw
from atom_kernels.sampling.keyed_draw_ref import keyed_draw_ref, kth_logits, uniform_of

__all__ = [
    "accepted_drafts",
    "accepted_drafts_ref",
    "greedy_tokens",
    "greedy_tokens_ref",
    "keyed_draw",
    "keyed_draw_ref",
    "kth_logits",
    "uniform_of",
]
