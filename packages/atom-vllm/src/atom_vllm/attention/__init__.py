"""ATOM's attention inside vLLM: backends of the adapter's own, "ATOM", "ATOM_MLA" and "ATOM_GDN".

backend.py   the AttentionBackend class vLLM selects (capabilities, impl and builder classes)
metadata.py  per-step metadata built from vLLM's CommonAttentionMetadata (atom-core's PagedAttentionMetadata)
impl.py      the per-layer forward: vLLM's KV pages as flash-layout views, then atom-core's paged_attention
layer.py     the atom-core AttentionBackend that ATOM models are built with: one vLLM Attention per layer
mla.py       DeepSeek's latent attention: the adapter's own layer over vLLM's latent cache ("ATOM_MLA")
gdn.py       Gated DeltaNet: the adapter's own mamba-type layer over vLLM's state cache, atom-core's gdn_step
gdn_backend.py  the "ATOM_GDN" mamba backend: its metadata builder, state dtypes and cache modes

Imported only inside vLLM processes (these modules import vLLM).
"""
