"""The "ATOM_GDN" mamba backend vLLM selects for ATOM's Gated DeltaNet layers (attention/gdn.py): the metadata
builder it names, the state dtypes vLLM resolves, and the cache modes the layer serves.

vLLM allocates each GDN layer's states per request (MambaSpec: a conv state and the recurrent state S,
shapes and dtypes from its own calculators) and builds the step's GDNAttentionMetadata with this
backend's builder, a GDNAttentionMetadataBuilder so that vLLM's runner hands it the speculative arguments.
"""

from __future__ import annotations

import torch
from vllm.model_executor.layers.mamba.mamba_utils import MambaStateDtypeCalculator, MambaStateShapeCalculator
from vllm.v1.attention.backend import AttentionBackend, AttentionCGSupport
from vllm.v1.attention.backends.gdn_attn import GDNAttentionMetadataBuilder

from atom_core.integration import GDNLayerSpec

GDN_BACKEND_NAME = "ATOM_GDN"
STATE_DTYPES = {torch.float32: "float32", torch.bfloat16: "bfloat16"}  # what atom-core's GDN ops keep


def vllm_state_dtypes(vllm_config) -> tuple[torch.dtype, torch.dtype]:
    """(conv, recurrent) state dtypes as vLLM resolves them (model dtype unless mamba_*_cache_dtype say)."""
    cache = vllm_config.cache_config
    return MambaStateDtypeCalculator.gated_delta_net_state_dtype(
        vllm_config.model_config.dtype, cache.mamba_cache_dtype, cache.mamba_ssm_cache_dtype
    )


def recurrent_state_dtype(vllm_config) -> str:
    """The recurrent state dtype for atom-core ("float32" / "bfloat16"), or a clear refusal."""
    dtype = vllm_state_dtypes(vllm_config)[1]
    if dtype not in STATE_DTYPES:
        raise NotImplementedError(
            f"ATOM's GDN layers keep the recurrent state in float32 or bfloat16; vLLM resolves it to "
            f"{dtype} for this model: pass mamba_ssm_cache_dtype='float32' (--mamba-ssm-cache-dtype)"
        )
    return STATE_DTYPES[dtype]


class AtomGDNMetadataBuilder(GDNAttentionMetadataBuilder):
    """vLLM's GDN metadata (request split, state blocks, accepted counts). Eager only for now: decode CUDA
    graphs of these layers under vLLM are untested (the GPU machine has no vLLM), though the step itself no
    longer reads the device on the host (atom-core's GDNBlockVerify)."""

    _cudagraph_support = AttentionCGSupport.NEVER


class AtomGDNBackend(AttentionBackend):
    """Gated DeltaNet over vLLM's per-request state blocks."""

    @staticmethod
    def get_name() -> str:
        return GDN_BACKEND_NAME

    @staticmethod
    def get_builder_cls() -> type[AtomGDNMetadataBuilder]:
        return AtomGDNMetadataBuilder

    @staticmethod
    def get_impl_cls():
        raise NotImplementedError("ATOM_GDN runs inside ATOM's own GDN layer (VllmGDNLayer)")

    @classmethod
    def is_ssm(cls) -> bool:
        return True


def refuse_cache_mode(mode: str, num_spec: int) -> None:
    """'none': one state per request; 'align' (vLLM's choice with prefix caching): states kept per block at
    block-aligned chunk ends, which vLLM's runner copies between a request's blocks before the step, so the
    layer still reads and writes one slot per request. With speculative decoding, align mode moves the
    per-draft states with vLLM's fused Triton copy kernels, which its CPU build lacks: not verified here."""
    if mode not in ("none", "align"):
        raise NotImplementedError(
            f"ATOM's GDN layers under vLLM support mamba_cache_mode 'none' and 'align', got {mode!r}"
        )
    if mode == "align" and num_spec:
        raise NotImplementedError(
            "ATOM's GDN layers under vLLM do not run prefix caching (mamba_cache_mode 'align') together with "
            f"speculative decoding ({num_spec} speculative tokens): pass enable_prefix_caching=False "
            "(--no-enable-prefix-caching)"
        )


def state_layout(vllm_config, spec: GDNLayerSpec) -> tuple[tuple, tuple[torch.dtype, torch.dtype]]:
    """The (conv, recurrent) state shapes and dtypes vLLM allocates for a layer of spec (this rank's heads),
    with its speculative tokens' extra conv columns and state blocks; refuses what the layer does not serve."""
    speculative = vllm_config.speculative_config
    num_spec = speculative.num_speculative_tokens if speculative is not None else 0
    refuse_cache_mode(vllm_config.cache_config.mamba_cache_mode, num_spec)
    dtypes = vllm_state_dtypes(vllm_config)
    if dtypes[1] != spec.state_dtype:
        raise ValueError(
            f"{spec.prefix}: built with a {spec.state_dtype} recurrent state, vLLM allocates {dtypes[1]}"
        )
    shapes = MambaStateShapeCalculator.gated_delta_net_state_shape(
        1, spec.num_k_heads, spec.num_v_heads, spec.head_k_dim, spec.head_v_dim, spec.conv_width, num_spec
    )
    return shapes, dtypes
