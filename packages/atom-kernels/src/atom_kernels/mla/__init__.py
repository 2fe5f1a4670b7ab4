"""MLA (multi-head latent attention, DeepSeek-V2/V3): the paged latent-cache write and absorbed attention
(decode, speculative verify and extend in one split-KV kernel), and the absorbed frontend's per-head products
for a few tokens."""

from atom_kernels.mla.absorb import MAX_ABSORB_TOKENS, absorb_output, absorb_query
from atom_kernels.mla.attention import mla_attention
from atom_kernels.mla.cache import write_latent

__all__ = ["MAX_ABSORB_TOKENS", "absorb_output", "absorb_query", "mla_attention", "write_latent"]
