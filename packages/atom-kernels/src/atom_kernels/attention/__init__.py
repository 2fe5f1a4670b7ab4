"""Paged attention: varlen prefill/extend and split-KV decode over the paged KV cache; causal attention of
fresh packed sequences (MLA's un-absorbed prefill)."""

from atom_kernels.attention.call import PagedCall
from atom_kernels.attention.decode import paged_decode
from atom_kernels.attention.partition import DecodePartition, plan_decode
from atom_kernels.attention.persistent import paged_decode_persistent
from atom_kernels.attention.prefill import paged_prefill
from atom_kernels.attention.ref import paged_attention_ref
from atom_kernels.attention.varlen import varlen_causal_attention

__all__ = [
    "DecodePartition",
    "PagedCall",
    "paged_attention_ref",
    "paged_decode",
    "paged_decode_persistent",
    "paged_prefill",
    "plan_decode",
    "varlen_causal_attention",
]
