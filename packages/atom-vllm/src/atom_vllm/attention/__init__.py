"""ATOM's attention inside vLLM: a vLLM v1 attention backend of the adapter's own, named "ATOM".

backend.py   the AttentionBackend class vLLM selects (capabilities, impl and builder classes)
metadata.py  per-step metadata built from vLLM's CommonAttentionMetadata (atom-core's PagedAttentionMetadata)
impl.py      the per-layer forward: vLLM's KV pages as flash-layout views, then atom-core's paged_attention
layer.py     the atom-core AttentionBackend that ATOM models are built with: one vLLM Attention per layer

Imported only inside vLLM processes (these modules import vLLM).
"""
