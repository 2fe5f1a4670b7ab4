"""Qwen3-Next and Qwen3.5 (dense and MoE; Gated DeltaNet + gated attention hybrids) against transformers,
fp32 on the CPU: a ragged batch prefilled together gives transformers' logits for every prompt token, and
the engine (state slots beside the paged KV cache, chunked prefill, preemption) gives its greedy tokens;
each prompt runs alone on the reference side. Qwen3.5-MoE also loads from fused 3-D expert tensors."""

import pytest
import torch
from core_support import hf_greedy

from atom_core.config import ConfigError, ModelConfig, ParallelConfig
from atom_core.engine import LLM, EngineConfig, SamplingParams
from atom_core.engine.model_runner import ModelRunner, StepInputs

VOCAB = 211


@pytest.fixture(scope="module", autouse=True)
def torch_reference_ops_on_the_cpu():
    """On the CPU every op runs its torch reference (the engine's kernel_backend reaches attention only; the
    interpreter would run norms, DeltaNet and MoE over hundreds of rows for minutes). The Triton kernels
    meet transformers in test_gdn_layer.py (interpreter) and in the GPU test below."""
    if torch.cuda.is_available():
        yield
        return
    from atom_kernels import settings
    from atom_kernels.settings import Backend, Settings

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "SETTINGS", Settings(Backend.TORCH, settings.SETTINGS.triton_interpret))
        yield


CONFIG = dict(
    vocab_size=VOCAB,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=4,
    layer_types=["linear_attention", "full_attention", "linear_attention", "full_attention"],
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    linear_num_key_heads=2,
    linear_num_value_heads=4,  # two value heads per key head
    linear_key_head_dim=16,
    linear_value_head_dim=32,  # key dim != value dim
    linear_conv_kernel_dim=4,
    num_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=32,
    shared_expert_intermediate_size=24,
    mlp_only_layers=[1],  # layer 1's MLP is dense
    max_position_embeddings=256,
    rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
)


MOE_KEYS = ("num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size")
ARCHS = {  # case: (transformers config class name, config without these keys, fuse the experts)
    "qwen3-next": ("Qwen3NextConfig", (), False),
    "qwen3.5": ("Qwen3_5TextConfig", (*MOE_KEYS, "mlp_only_layers"), False),
    "qwen3.5-moe": ("Qwen3_5MoeTextConfig", ("mlp_only_layers", "intermediate_size"), False),
    "qwen3.5-moe-fused": ("Qwen3_5MoeTextConfig", ("mlp_only_layers", "intermediate_size"), True),
    # the published architecture: text_config + a vision tower, served text-only
    "qwen3.5-conditional-generation": ("Qwen3_5Config", (*MOE_KEYS, "mlp_only_layers"), False),
}
VISION = dict(
    depth=1,
    hidden_size=32,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=48,
    patch_size=4,
    spatial_merge_size=2,
    temporal_patch_size=1,
)


def qwen3_next_checkpoint(path, case: str = "qwen3-next"):
    """A random tiny model of `case` saved by transformers (per-expert keys, or fused 3-D expert tensors as
    Qwen3.5-MoE checkpoints also ship), with every norm, gate and decay randomized so each path matters.
    Returns transformers' model."""
    import transformers
    from safetensors.torch import load_file, save_file
    from transformers import AutoModelForCausalLM

    config_name, dropped, fused = ARCHS[case]
    fields = {k: v for k, v in CONFIG.items() if k not in dropped}
    torch.manual_seed(0)
    if config_name == "Qwen3_5Config":
        config = transformers.Qwen3_5Config(text_config=fields, vision_config=VISION)
        model = transformers.Qwen3_5ForConditionalGeneration(config).float()
        config = config.text_config
    else:
        config = getattr(transformers, config_name)(**fields)
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight") and "linear_attn" not in name:
                param.uniform_(-0.3, 0.3)  # the (1 + w) norms
            elif name.endswith(("A_log", "dt_bias")) or "linear_attn.norm" in name:
                param.uniform_(0.3, 1.5)
            elif param.dim() >= 2:
                param.normal_(0, 0.15)
    model.eval().save_pretrained(path)
    if fused:
        tensors, experts = load_file(path / "model.safetensors"), config.num_experts
        for layer in range(config.num_hidden_layers):
            p = f"model.layers.{layer}.mlp.experts"
            per_expert = {
                w: [tensors.pop(f"{p}.{e}.{w}_proj.weight") for e in range(experts)]
                for w in ("gate", "up", "down")
            }
            gate_up = [torch.cat([g, u]) for g, u in zip(per_expert["gate"], per_expert["up"], strict=True)]
            tensors[f"{p}.gate_up_proj"] = torch.stack(gate_up)  # [E, 2I, H], gate rows first
            tensors[f"{p}.down_proj"] = torch.stack(per_expert["down"])  # [E, H, I]
        save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    return model


@pytest.fixture(scope="module", params=list(ARCHS))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return path, qwen3_next_checkpoint(path, request.param)


# shorter and longer than the 64-token DeltaNet chunk, and one of three tokens
PROMPTS = [
    [5, 17, 42, 9, 100, 3, 77, 31, 2, 8, 64, 19, 150],
    [8, 8, 150],
    [(7 * i) % 190 + 2 for i in range(70)],
]
STEPS = 32


def test_prefill_logits_match_transformers(checkpoint):
    path, hf = checkpoint
    config = ModelConfig.from_pretrained(path)
    engine = EngineConfig(model=path, num_kv_blocks=32, kernel_backend="torch", block_size=4, dtype="float32")
    runner = ModelRunner(
        config, engine, parallel=ParallelConfig(), device=torch.device("cpu"), max_model_len=64
    )
    ids, positions, tables, start = [], [], [], 1
    for p in PROMPTS:
        ids += p
        positions += list(range(len(p)))
        pages = -(-len(p) // 4)
        tables.append(list(range(start, start + pages)))
        start += pages
    lens = [len(p) for p in PROMPTS]
    rows = list(range(len(ids)))
    logits = runner.run(StepInputs(ids, positions, lens, lens, tables, rows, [2, 0, 1], [True] * 3, rows))
    offset = 0
    for p in PROMPTS:
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0]
        got = logits[offset : offset + len(p)]
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-4 * max(ref.abs().max().item(), 1.0))
        offset += len(p)


def test_engine_greedy_matches_transformers_with_chunks_and_preemption(checkpoint):
    path, hf = checkpoint
    # 30 blocks of 4 cannot hold all three sequences (47 blocks): one is preempted and recomputed (its state
    # starts over)
    llm = LLM(
        path,
        kernel_backend="torch",
        dtype="float32",
        block_size=4,
        num_kv_blocks=30,
        max_num_batched_tokens=24,  # prompts prefill in chunks: the DeltaNet state carries across them
    )
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for p, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, p, STEPS)
    engine = llm.engine
    assert engine.scheduler.num_chunked_prefills > 0 and engine.scheduler.num_preemptions > 0


def test_layer_types_are_checked_by_name():
    hf = {
        "architectures": ["Qwen3NextForCausalLM"],
        **CONFIG,
        "layer_types": ["linear_attention", "mamba"] * 2,
    }
    from atom_core.registry import get_model_spec

    config = ModelConfig.from_hf_dict(hf)
    with pytest.raises(ConfigError, match=r"layer_types must name each of the 4 layers .* 'mamba'"):
        get_model_spec("Qwen3NextForCausalLM").attention_kinds(config)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and the Triton GDN kernels need a GPU")
def test_hybrid_decode_graphs_on_a_gpu(checkpoint):
    """fp32 on the GPU: Triton DeltaNet, attention and MoE kernels, decode steps replaying CUDA graphs that
    read and write the state slots; greedy tokens are transformers'."""
    path, hf = checkpoint
    llm = LLM(path, dtype="float32", max_model_len=128, max_num_seqs=4, num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for p, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, p, STEPS)
    assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.replays > 0
    llm.engine.shutdown()
