"""Sampling kernels: the greedy token of each row and whether the row is finite, in one launch."""

from atom_kernels.sampling.greedy import greedy_tokens, greedy_tokens_ref

__all__ = ["greedy_tokens", "greedy_tokens_ref"]
