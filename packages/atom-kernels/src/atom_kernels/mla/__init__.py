"""MLA (multi-head latent attention, DeepSeek-V2/V3): the paged latent-cache write and absorbed attention
(decode, speculative verify and extend in one split-KV kernel)."""

from atom_kernels.mla.attention import mla_attention
from atom_kernels.mla.cache import write_latent

__all__ = ["mla_attention", "write_latent"]
