"""GLM-4.5 / 4.6 against transformers: q/k/v biases, q/k norms and rotary on half of each head, DeepSeek-V3's
MoE (sigmoid grouped routing with a correction bias, shared experts, a dense first layer), randomized norms
and biases. Then the engine (chunked prefill, prefix hits, preemption), transformers' config default, and
the MTP draft against transformers' own MTP module (forced-draft speculation: test_oracle_drafts.py)."""

import json

import pytest
import torch
from core_fixtures.drafts import draft_logits_in_two_forwards, mtp
from core_fixtures.family import (
    assert_engine_under_pressure,
    assert_matches_transformers,
    assert_triton_matches_transformers,
    prompts,
)
from core_fixtures.references import hf_main_hidden, torch_reference_ops
from transformers import AutoModelForCausalLM, Glm4MoeConfig

from atom_core.config import ModelConfig, ParallelConfig
from atom_core.engine import EngineConfig
from atom_core.engine.execution.model_runner import ModelRunner
from tools.testing_models import (
    TINY_ARCHITECTURES,
    TINY_DIMS,
    random_checkpoint,
    random_deepseek_mtp_checkpoint,
    transformers_mtp_logits,
)

GLM_TINY = dict(TINY_DIMS, **TINY_ARCHITECTURES["Glm4MoeForCausalLM"], vocab_size=211, num_hidden_layers=3)


def glm_extras(model) -> None:
    """Norms and biases as a trained model has them (not ones and zeros), routers with decisive scores and
    a non-zero correction bias."""
    gen = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("bias") or "norm" in name:
                base = 1.0 if "norm" in name else 0.0
                param.copy_(base + 0.3 * torch.randn(param.shape, generator=gen))
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0, 0.5, generator=gen)
                layer.mlp.gate.e_score_correction_bias.uniform_(-0.3, 0.3, generator=gen)


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    path = tmp_path_factory.mktemp("glm") / "ckpt"
    return random_checkpoint(Glm4MoeConfig(**GLM_TINY), path, edit=glm_extras)


def test_logits_and_greedy_tokens_match_transformers(glm):
    hf, path = glm
    assert hf.model.rotary_emb.inv_freq.numel() * 2 == GLM_TINY["head_dim"] // 2  # rotary on half a head
    assert_matches_transformers(hf, path, prompts(1, (13, 3, 21)))


def test_without_q_k_norms_and_biases(tmp_path):
    """GLM-4.5-Air's form: no q/k norms and no attention biases (use_qk_norm and attention_bias False)."""
    fields = dict(GLM_TINY, use_qk_norm=False, attention_bias=False, num_hidden_layers=2)
    hf, path = random_checkpoint(Glm4MoeConfig(**fields), tmp_path / "ckpt", edit=glm_extras)
    assert not any("q_norm" in name or "q_proj.bias" in name for name, _ in hf.named_parameters())
    assert_matches_transformers(hf, path, prompts(2, (9, 14)))


def test_triton_kernels_through_the_native_backend(glm):
    """The same parity on atom-kernels' Triton path: partial rotary after the q/k norms, the grouped
    routing and the expert GEMMs."""
    assert_triton_matches_transformers(*glm, prompts(6, (11, 4)))


def test_engine_chunks_prefix_hits_and_preemption(glm):
    assert_engine_under_pressure(*glm)


MOE_FIELDS = (
    "n_routed_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
    "n_shared_experts",
    "first_k_dense_replace",
    "n_group",
    "topk_group",
    "norm_topk_prob",
    "routed_scaling_factor",
)


def test_a_config_silent_on_rotary_and_moe_fields_gets_transformers_defaults(tmp_path):
    config = {"architectures": ["Glm4MoeForCausalLM"], **GLM_TINY}
    for key in ("partial_rotary_factor", *MOE_FIELDS):
        config.pop(key, None)
    (tmp_path / "config.json").write_text(json.dumps(config))
    hf = Glm4MoeConfig(**{k: v for k, v in config.items() if k != "architectures"})
    atom = ModelConfig.from_pretrained(tmp_path)
    assert atom.rope.partial_rotary_factor == hf.rope_parameters["partial_rotary_factor"] == 0.5
    assert {k: atom.hf[k] for k in MOE_FIELDS} == {k: getattr(hf, k) for k in MOE_FIELDS}


def test_the_mtp_draft_equals_transformers_mtp_module(tmp_path):
    """The draft (DeepSeek's MTP structure around a GLM decoder layer) against transformers' MtpModel built
    from the same checkpoint, its rows in two forwards so that its KV cache carries over."""
    fields = dict(GLM_TINY, num_hidden_layers=2)
    random_deepseek_mtp_checkpoint(fields, tmp_path, config_class=Glm4MoeConfig)
    main = AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    engine = EngineConfig(
        model=tmp_path, num_kv_blocks=32, speculative_config=mtp(1), kernel_backend="torch", block_size=4
    )
    with torch_reference_ops():
        config = ModelConfig.from_pretrained(tmp_path)
        runner = ModelRunner(config, engine, parallel=ParallelConfig(), device=torch.device("cpu"))
        tokens = prompts(7, (19,))[0]
        got = draft_logits_in_two_forwards(runner, tokens, state_slot=-1)
    with torch.no_grad():
        ids = torch.tensor([tokens])
        published = transformers_mtp_logits(tmp_path, ids, hf_main_hidden(main, ids))
    torch.testing.assert_close(got, published, rtol=0, atol=1e-4 * published.abs().max().item())
