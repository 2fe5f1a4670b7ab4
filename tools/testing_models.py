"""Test helpers every environment's tests share (atom-core's, atom-vllm's and atom-sglang's support modules
re-export them): random checkpoints built locally (no model hub) and free localhost ports.

The repository root is on sys.path in every test environment (the root pyproject's pytest pythonpath), so
this module is importable there; it needs only torch and transformers, which every environment has.
"""

from __future__ import annotations

import socket
from pathlib import Path

import torch

# Tiny DeepSeek-V3 and V2 (MLA with a 32 + 16 latent row, DeepSeek's MoE after one dense layer): the
# attention and expert fields atom-core's parity tests and the adapters' engine tests share.
DEEPSEEK_V3_TINY = dict(
    intermediate_size=96,
    moe_intermediate_size=32,
    num_attention_heads=4,
    num_key_value_heads=4,
    n_shared_experts=1,
    n_routed_experts=8,
    num_experts_per_tok=3,
    n_group=4,
    topk_group=2,
    first_k_dense_replace=1,
    routed_scaling_factor=2.5,
    norm_topk_prob=True,
    kv_lora_rank=32,
    q_lora_rank=48,
    qk_rope_head_dim=16,
    qk_nope_head_dim=32,
    v_head_dim=24,
    tie_word_embeddings=False,
)
_MLA_FIELDS = ("kv_lora_rank", "q_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim", "v_head_dim")
DEEPSEEK_V2_TINY = dict(
    DEEPSEEK_V3_TINY,
    n_shared_experts=2,
    routed_scaling_factor=1.5,
    norm_topk_prob=False,
    q_lora_rank=None,
)
for _key in ("n_group", "topk_group"):  # V2-Lite routes greedily over all experts
    DEEPSEEK_V2_TINY.pop(_key)

# The tiny models every surface's tests build: the dimensions they share, then each architecture's variant
# (GQA, head_dim != hidden / heads, tied embeddings, q/k norms (Qwen3), routed experts (Qwen3-MoE), a
# shared expert (Qwen2-MoE), Mixtral's top-2 experts and window, DeepSeek's MLA with grouped (V3) and
# greedy (V2) routing, GLM's partial rotary beside DeepSeek's MoE, Gemma 3's sandwich norms and two
# rotary bases, GPT-OSS's sinks and biases). A suite adds its vocabulary and what its engine needs
# (adapters' support modules, atom-core's core_fixtures).
TINY_DIMS = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, max_position_embeddings=256)
_QWEN3_HEADS = dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)
TINY_ARCHITECTURES = {
    "LlamaForCausalLM": dict(num_attention_heads=4, num_key_value_heads=2),
    "Qwen3ForCausalLM": dict(_QWEN3_HEADS, tie_word_embeddings=True),
    "Qwen3MoeForCausalLM": dict(
        _QWEN3_HEADS,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        norm_topk_prob=True,
    ),
    "Qwen2MoeForCausalLM": dict(
        num_attention_heads=2,
        num_key_value_heads=2,
        num_experts=4,
        num_experts_per_tok=2,
        moe_intermediate_size=32,
        shared_expert_intermediate_size=48,
    ),
    # top-2 of 4 experts over every layer, a window of 8 on every layer
    "MixtralForCausalLM": dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
    ),
    "DeepseekV3ForCausalLM": DEEPSEEK_V3_TINY,
    "DeepseekV2ForCausalLM": DEEPSEEK_V2_TINY,
    # Llama's attention with q/k/v biases, q/k norms and rotary on half of each head, DeepSeek-V3's MoE
    "Glm4MoeForCausalLM": dict(
        {k: v for k, v in DEEPSEEK_V3_TINY.items() if k not in _MLA_FIELDS},
        num_key_value_heads=2,
        head_dim=32,
        attention_bias=True,
        use_qk_norm=True,
        partial_rotary_factor=0.5,
    ),
    # sandwich norms, q/k norms, a softmax scale of 24 ** -0.5, local and global layers (windows of 8) with
    # their own rotary bases (the global ones linearly scaled)
    "Gemma3ForCausalLM": dict(
        _QWEN3_HEADS,
        sliding_window=8,
        sliding_window_pattern=2,
        query_pre_attn_scalar=24,
        rope_parameters={
            "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            "full_attention": {"rope_type": "linear", "factor": 4.0, "rope_theta": 10000.0},
        },
    ),
    # attention sinks, q/k/v/o biases, windows of 8 on every other layer, biased router and experts
    "GptOssForCausalLM": dict(
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=32,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
    ),
}


def config_class_name(architecture: str) -> str:
    """transformers' config class of an architecture's tiny model: the family's (LlamaForCausalLM ->
    LlamaConfig), or the text model's where the family's name is the multimodal one (Gemma 3)."""
    family = architecture.removesuffix("ForCausalLM")
    return {"Gemma3": "Gemma3TextConfig"}.get(family, f"{family}Config")


def decisive_routing(model) -> None:
    """Give a random DeepSeek model's routers decisive scores (and a non-zero correction bias), so that no
    near-tie between experts flips with the summation order of another implementation."""
    with torch.no_grad():
        for layer in model.model.layers:
            if hasattr(layer.mlp, "gate"):
                layer.mlp.gate.weight.normal_(0, 0.5)
                if hasattr(layer.mlp.gate, "e_score_correction_bias"):
                    layer.mlp.gate.e_score_correction_bias.uniform_(-0.3, 0.3)


def random_checkpoint(config, path: Path, *, seed: int = 0, max_shard_size=None, dtype=None, edit=None):
    """transformers' model of `config` (any model config) with random weights drawn after
    torch.manual_seed(seed), changed by edit(model) if given, saved to `path` (in shards of at most
    `max_shard_size` if given). Returns (the model in eval mode, path)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, **({} if dtype is None else {"dtype": dtype})).eval()
    if edit is not None:
        edit(model)
    model.save_pretrained(path, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
    return model, path


def free_port() -> int:
    """A localhost TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def successor_language(vocab: int, seed: int = 0):
    """A synthetic second-order language over ids 2.. (0 and 1 are BOS and EOS): token t after token u is
    followed by succ[u < vocab // 2][t] four times in five, else by a random token. A draft must know the
    token before the one it reads, which a chained MTP step only has through its own hidden state, so
    longer chains are accepted less often. Returns (succ [2, vocab], sample(batch, length, generator))."""
    gen = torch.Generator().manual_seed(seed)
    succ = torch.stack([torch.arange(2, vocab)[torch.randperm(vocab - 2, generator=gen)] for _ in range(2)])
    succ = torch.cat([torch.full((2, 2), 2), succ], dim=1)

    def sample(batch: int, length: int, generator: torch.Generator) -> torch.Tensor:
        rows = [torch.randint(2, vocab, (batch,), generator=generator) for _ in range(2)]
        for _ in range(length - 2):
            noise = torch.randint(2, vocab, (batch,), generator=generator)
            keep = torch.rand(batch, generator=generator) < 0.8
            follow = succ[(rows[-2] < vocab // 2).long(), rows[-1]]
            rows.append(torch.where(keep, follow, noise))
        return torch.stack(rows, 1)

    return succ, sample


def random_deepseek_mtp_checkpoint(fields: dict, path: Path, *, seed: int = 0, config_class=None) -> Path:
    """A random tiny DeepSeek-V3 (transformers config `fields`, decisive routing) with one random MTP layer,
    saved as the published checkpoints are: model.layers.{L}.* (L = num_hidden_layers) holds a decoder layer
    plus enorm, hnorm, eh_proj, shared_head.norm and the copies of the embedding and head;
    num_nextn_predict_layers 1. config_class: another family with DeepSeek's MTP layout (GLM-4.5's)."""
    import json

    from safetensors.torch import load_file, save_file
    from transformers import DeepseekV3Config

    layers = fields["num_hidden_layers"]
    random_checkpoint(
        (config_class or DeepseekV3Config)(**{**fields, "num_hidden_layers": layers + 1}),
        path,
        seed=seed,
        edit=decisive_routing,
    )
    tensors = load_file(path / "model.safetensors")
    g = torch.Generator().manual_seed(seed + 1)
    h, mtp = fields["hidden_size"], f"model.layers.{layers}"
    for norm in ("enorm", "hnorm", "shared_head.norm"):
        tensors[f"{mtp}.{norm}.weight"] = 1 + 0.1 * torch.randn(h, generator=g)
    tensors[f"{mtp}.eh_proj.weight"] = torch.randn(h, 2 * h, generator=g) / (2 * h) ** 0.5
    tensors[f"{mtp}.embed_tokens.weight"] = tensors["model.embed_tokens.weight"].clone()
    tensors[f"{mtp}.shared_head.head.weight"] = tensors["lm_head.weight"].clone()
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config.update(num_hidden_layers=layers, num_nextn_predict_layers=1)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return path


def transformers_mtp_logits(path: Path, ids: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    """transformers' own MTP (modeling_layers.MtpModel, DeepSeek-V3's MtpLayer), its weights loaded by
    transformers from the checkpoint: row i reads Emb(t_{i+1}) and h_i (the target's final hidden state,
    after its norm) -> logits [T - 1, V] predicting t_{i+2}. ids: [1, T]; hidden: [1, T, H]. Its MTP keys
    are found by the target's pattern, which names layer 61 (the published model); ours is layer L."""
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM
    from transformers.modeling_layers import MtpModel

    main = AutoModelForCausalLM.from_pretrained(path, attn_implementation="eager", dtype=torch.float32)
    layers = main.config.num_hidden_layers
    main._keys_to_ignore_on_load_unexpected = [rf"model\.layers\.{layers}\..*"]
    mtp_model = MtpModel.from_pretrained(main).eval()
    saved = load_file(path / "model.safetensors")[f"model.layers.{layers}.eh_proj.weight"]
    torch.testing.assert_close(mtp_model.layers[0].eh_proj.weight, saved, rtol=0, atol=0)  # it loaded ours
    n = ids.shape[1] - 1
    positions = torch.arange(1, n + 1)[None]  # the embedded token's positions; RoPE is relative, so any shift
    embeds = mtp_model.embed_tokens(ids[:, 1:])
    mask = torch.full((n, n), torch.finfo(torch.float32).min).triu(1)[None, None]
    with torch.no_grad():
        out = mtp_model.layers[0](
            embeds,
            hidden[:, :-1],
            position_embeddings=mtp_model.rotary_emb(embeds, positions),
            attention_mask=mask,
            position_ids=positions,
            past_key_values=None,
        )
        return mtp_model._project_to_logits(out)[0]
