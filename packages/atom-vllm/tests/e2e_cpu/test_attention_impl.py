"""The ATOM backend's impl refuses, by name, the vLLM attention features it does not implement yet."""

import pytest
import torch
from vllm.config import VllmConfig, set_current_vllm_config

from atom_vllm.attention.impl import AtomAttentionImpl


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [
        (dict(sinks=torch.zeros(4)), "sinks"),  # a tensor: must not be compared like a flag
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
