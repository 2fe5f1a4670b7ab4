"""The ATOM backend's impl refuses, by name, the vLLM attention features it does not implement yet."""

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config

from atom_vllm.attention.impl import AtomAttentionImpl


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(head_scales=torch.zeros(4)), "head_scales"),  # a tensor: must not be compared like a flag
        (dict(logits_soft_cap=5.0), "logits_soft_cap"),
        (dict(alibi_slopes=[1.0] * 4), "alibi_slopes"),
        (dict(kv_sharing_target_layer_name="model.layers.0.attn"), "kv_sharing_target_layer_name"),
        (dict(attn_type="encoder_only"), "encoder_only"),
    ],
)
def test_unsupported_features_are_refused_by_name(kwargs, name):
    with set_current_vllm_config(VllmConfig()):
        AtomAttentionImpl(4, 32, 0.1, 2)  # plain decoder attention is accepted
        with pytest.raises(NotImplementedError, match=name):
            AtomAttentionImpl(4, 32, 0.1, 2, **kwargs)


def test_sinks_are_taken_one_per_head():
    with set_current_vllm_config(VllmConfig()):
        assert AtomAttentionImpl(4, 32, 0.1, 2, sinks=torch.zeros(4)).sinks.shape == (4,)
        with pytest.raises(ValueError, match=r"sinks must be \[num_heads=4\], got \(2,\)"):
            AtomAttentionImpl(4, 32, 0.1, 2, sinks=torch.zeros(2))


def test_a_full_layer_does_not_inherit_vllms_model_wide_window():
    # vLLM hands a layer without a window of its own CacheConfig.sliding_window; atom-core decided each
    # layer's window already, so the adapter's full layers must stay full.
    from vllm.config import CacheConfig

    from atom_core.integration import AttentionLayerSpec
    from atom_vllm.attention.layer import CoreAttentionBackend
    from atom_vllm.registration import register_attention_backend

    register_attention_backend()
    cache = CacheConfig(sliding_window=8)
    with set_current_vllm_config(VllmConfig(cache_config=cache)):
        backend = CoreAttentionBackend(cache)
        full = backend.make_layer(AttentionLayerSpec(0, 4, 2, 32, 0.1, "model.layers.0.self_attn.attn"))
        windowed = backend.make_layer(
            AttentionLayerSpec(1, 4, 2, 32, 0.1, "model.layers.1.self_attn.attn", sliding_window=5)
        )
    assert (full.sliding_window, full.impl.sliding_window) == (None, None)
    assert (windowed.sliding_window, windowed.impl.sliding_window) == (5, 5)
    assert cache.sliding_window == 8  # the engine's own config is left as it was
