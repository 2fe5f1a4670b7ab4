"""Block-quantized fp8 checkpoints (DeepSeek-V3's format) on the CPU: ATOM equals transformers run on the
dequantized checkpoint, for Llama, Qwen3-MoE, Mixtral, GLM-4.5, Gemma 3, DeepSeek-V3 and Qwen3.5-MoE, with blocks small enough that
tiny tensors have several and ragged edge blocks (DeepSeek's kv_a_proj_with_mqa is 48 rows in 32-row
blocks here, as the real one is 576 in 128). Under tensor parallel the shards cut scale blocks. Bad
checkpoints are refused naming the tensor or the config field."""

import json
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from core_fixtures.architectures import DSV3, TINY
from core_fixtures.checkpoints import deepseek_checkpoint
from core_fixtures.references import hf_greedy, ragged_prefill_logits
from transformers import (
    AutoModelForCausalLM,
    DeepseekV3Config,
    Gemma3TextConfig,
    Glm4MoeConfig,
    LlamaConfig,
    MixtralConfig,
    Qwen3MoeConfig,
)

from atom_core.config import ConfigError, ModelConfig, ParallelConfig
from atom_core.engine import LLM, SamplingParams
from atom_core.loader import CheckpointError, build_model, load_checkpoint
from atom_core.models.weights import WeightLoadError
from atom_core.quantization import Fp8BlockLinearMethod
from tools.testing_fp8 import dequantized_copy, edit_checkpoint, quantize_checkpoint
from tools.testing_models import TINY_ARCHITECTURES, free_port, random_checkpoint
from tools.testing_qwen import qwen3_next_checkpoint


@pytest.fixture(scope="module", autouse=True)
def torch_reference_ops():
    """The torch reference ops, also on a GPU: these tests are about loading and the layers, to fp32
    precision (the kernels quantize activations beyond 16 rows; they meet the same references in
    atom-kernels' tests, and the bf16 GPU test below runs them)."""
    from atom_kernels import settings
    from atom_kernels.settings import Backend, Settings

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "SETTINGS", Settings(Backend.TORCH, settings.SETTINGS.triton_interpret))
        yield


def _llama(path):
    config = LlamaConfig(**{**TINY, "intermediate_size": 88})  # 88 = 2.75 blocks of 32: ragged
    random_checkpoint(config, path)


def _qwen3_moe(path):
    config = Qwen3MoeConfig(
        **{**TINY, "head_dim": 16, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 40}
    )
    random_checkpoint(config, path)


def _mixtral(path):
    config = MixtralConfig(
        **{
            **TINY,
            "intermediate_size": 40,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 9,
        }
    )
    random_checkpoint(config, path)


def _glm4_moe(path):
    fields = {
        k: v for k, v in TINY_ARCHITECTURES["Glm4MoeForCausalLM"].items() if k != "moe_intermediate_size"
    }
    random_checkpoint(Glm4MoeConfig(**{**TINY, **fields, "moe_intermediate_size": 40}), path)


def _gemma3(path):
    random_checkpoint(
        Gemma3TextConfig(**{**TINY, **TINY_ARCHITECTURES["Gemma3ForCausalLM"], "intermediate_size": 88}), path
    )


def _deepseek(path):
    deepseek_checkpoint(path, DeepseekV3Config, DSV3, {})  # kv_a_proj_with_mqa: 32 + 16 = 48 rows


def _qwen3_5_moe(path):
    qwen3_next_checkpoint(path, "qwen3.5-moe")  # hidden 48: 1.5 blocks of 32


CASES = {  # name: (make the random checkpoint, block, scale dtype)
    "llama": (_llama, (32, 32), torch.float32),
    "qwen3-moe": (_qwen3_moe, (16, 16), torch.float32),
    "mixtral": (_mixtral, (16, 16), torch.float32),  # block_sparse_moe.experts.E.w1/w2/w3
    "glm4-moe": (_glm4_moe, (16, 16), torch.float32),  # 40-wide experts: 2.5 blocks, ragged
    "gemma3": (_gemma3, (32, 32), torch.float32),
    "deepseek-v3": (_deepseek, (32, 32), torch.float32),
    "qwen3.5-moe": (_qwen3_5_moe, (32, 32), torch.bfloat16),  # as the Qwen3.5 fp8 releases store them
}
PROMPTS = [
    [5, 17, 42, 9, 100, 3, 77, 31, 2, 8, 64, 19, 150],
    [8, 8, 150],
    [(7 * i) % 190 + 2 for i in range(21)],
]
STEPS = 16


@pytest.fixture(scope="module", params=list(CASES))
def checkpoints(request, tmp_path_factory):
    """(fp8 checkpoint, transformers on its dequantized twin, transformers on the original weights)."""
    make, block, scale_dtype = CASES[request.param]
    root = tmp_path_factory.mktemp(request.param)
    make(root / "original")
    quantized = quantize_checkpoint(
        root / "original",
        root / "fp8",
        block,
        scale_dtype=scale_dtype,
        with_not_convert=request.param == "qwen3.5-moe",
    )
    assert len(quantized) >= 7
    dequantized_copy(root / "fp8", root / "dequantized")
    load = lambda p: AutoModelForCausalLM.from_pretrained(p, dtype=torch.float32).eval()  # noqa: E731
    return root / "fp8", load(root / "dequantized"), load(root / "original")


def _prefill_logits(path, parallel=None) -> list[torch.Tensor]:
    return ragged_prefill_logits(path, PROMPTS, parallel=parallel)


def test_fp8_layers_are_built_from_the_checkpoint(checkpoints):
    path, _, _ = checkpoints
    config = ModelConfig.from_pretrained(path)
    from atom_core.attention import PagedAttentionBackend
    from atom_core.build import BuildContext

    model = build_model(config, BuildContext(PagedAttentionBackend(kernel_backend="torch")))
    fp8 = {
        m.prefix
        for m in model.modules()
        if isinstance(getattr(m, "quant_method", None), Fp8BlockLinearMethod)
    }
    assert any(p.endswith(("qkv_proj", "q_b_proj", "q_proj")) for p in fp8)
    assert not any(p.endswith((".gate", "shared_expert_gate", "in_proj_a", "in_proj_b")) for p in fp8)
    assert all(
        p.dtype == torch.float8_e4m3fn for n, p in model.named_parameters() if n.endswith((".w13", ".w2"))
    )


def test_prefill_logits_equal_transformers_on_the_dequantized_checkpoint(checkpoints):
    path, dequantized, original = checkpoints
    for prompt, got in zip(PROMPTS, _prefill_logits(path), strict=True):
        with torch.no_grad():
            ref = dequantized(torch.tensor([prompt])).logits[0]
            unquantized = original(torch.tensor([prompt])).logits[0]
        scale = max(ref.abs().max().item(), 1.0)
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-4 * scale)
        # the quantization error is far above that tolerance: a loader that ignored the scales would fail
        assert (unquantized - ref).abs().max() > 100 * 1e-4 * scale


def test_engine_greedy_equals_transformers_on_the_dequantized_checkpoint(checkpoints):
    path, dequantized, _ = checkpoints
    llm = LLM(
        path,
        kernel_backend="torch",
        dtype="float32",
        block_size=4,
        num_kv_blocks=48,
        max_num_batched_tokens=16,
    )
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for prompt, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(dequantized, prompt, STEPS)


def _rank(rank: int, world: int, port: int, path: str, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), ATOM_KERNELS_BACKEND="torch")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        logits = _prefill_logits(path, ParallelConfig(tp_size=world, tp_rank=rank, group=dist.group.WORLD))
        torch.save(torch.cat(logits), f"{out}.{rank}")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("case", ["qwen3-moe", "llama"])
def test_tp2_equals_tp1(tmp_path, case):
    """64-wide blocks over an intermediate size of 96: each rank's 48 expert (or gate/up) rows and down
    columns start inside a block, so the ranks keep 16-wide scale groups."""
    if case == "qwen3-moe":
        experts = dict(head_dim=16, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=96)
        random_checkpoint(Qwen3MoeConfig(**{**TINY, **experts}), tmp_path / "original")
    else:
        random_checkpoint(LlamaConfig(**{**TINY, "num_attention_heads": 8}), tmp_path / "original")
    block = (64, 64)
    quantize_checkpoint(tmp_path / "original", tmp_path / "fp8", block)
    single = torch.cat(_prefill_logits(tmp_path / "fp8"))
    out = str(tmp_path / "logits")
    mp.start_processes(
        _rank, args=(2, free_port(), str(tmp_path / "fp8"), out), nprocs=2, join=True, start_method="spawn"
    )
    for rank in range(2):
        torch.testing.assert_close(torch.load(f"{out}.{rank}"), single, rtol=1e-5, atol=1e-5)


@pytest.fixture(scope="module")
def llama_fp8(tmp_path_factory):
    root = tmp_path_factory.mktemp("bad")
    _llama(root / "original")
    quantize_checkpoint(root / "original", root / "fp8", (32, 32))
    return root


def _copy(root, name):
    import shutil

    shutil.copytree(root / "fp8", root / name, dirs_exist_ok=True)
    return root / name


def _load(path):
    from atom_core.attention import PagedAttentionBackend
    from atom_core.build import BuildContext

    config = ModelConfig.from_pretrained(path)
    model = build_model(config, BuildContext(PagedAttentionBackend(kernel_backend="torch")))
    load_checkpoint(model, path)


def test_a_scale_of_the_wrong_shape_is_named(llama_fp8):
    name = "model.layers.1.mlp.down_proj.weight_scale_inv"
    path = _copy(llama_fp8, "wrong-shape")
    edit_checkpoint(path, lambda t: t.__setitem__(name, torch.ones(2, 2)))
    with pytest.raises(
        WeightLoadError, match=rf"{name}.*expected a block scale of shape \(2, 3\).*got \(2, 2\)"
    ):
        _load(path)


def test_a_missing_scale_is_named(llama_fp8):
    path = _copy(llama_fp8, "missing")
    edit_checkpoint(path, lambda t: t.pop("model.layers.0.self_attn.o_proj.weight_scale_inv"))
    with pytest.raises(
        CheckpointError, match=r"missing tensors for: model\.layers\.0\.self_attn\.o_proj\.weight_scale_inv"
    ):
        _load(path)


def test_an_unquantized_weight_where_the_config_says_fp8_is_named(llama_fp8):
    path = _copy(llama_fp8, "unquantized")
    name = "model.layers.0.mlp.up_proj.weight"

    def dequantize(t):
        t[name] = t[name].float()
        del t[name + "_scale_inv"]

    edit_checkpoint(path, dequantize)
    with pytest.raises(
        WeightLoadError, match=rf"{name}' is torch.float32, but .*fp8 quantization_config makes"
    ):
        _load(path)


def test_an_fp8_weight_in_a_module_not_to_convert_is_named(llama_fp8):
    path = _copy(llama_fp8, "not-convert")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"] = ["model.layers.1.self_attn.o_proj"]
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        WeightLoadError, match=r"o_proj.weight' is torch.float8_e4m3fn, but .* is unquantized"
    ):
        _load(path)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (dict(quant_method="awq"), r"quant_method 'awq' is not supported .*block-quantized 'fp8'"),
        (dict(activation_scheme="static"), r"activation_scheme 'static' is not supported"),
        (dict(weight_block_size=None), r"weight_block_size None is not supported.*per-tensor"),
        (dict(fmt="e5m2"), r"fmt 'e5m2' is not supported"),
        (dict(kv_cache_scheme={}), r"has 'kv_cache_scheme', which ATOM does not implement"),
    ],
)
def test_unsupported_quantization_configs_are_named(llama_fp8, change, message):
    path = _copy(llama_fp8, "config")
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"].update(change)
    (path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=message):
        LLM(path, kernel_backend="torch", load_format="dummy")


def test_a_shard_that_cuts_scale_groups_too_fine_is_refused(tmp_path):
    random_checkpoint(LlamaConfig(**{**TINY, "intermediate_size": 88}), tmp_path / "original")
    quantize_checkpoint(tmp_path / "original", tmp_path / "fp8", (64, 64))
    from atom_core.attention import PagedAttentionBackend
    from atom_core.build import BuildContext

    ctx = BuildContext(
        PagedAttentionBackend(kernel_backend="torch"), parallel=ParallelConfig(tp_size=2, tp_rank=1)
    )
    with pytest.raises(
        ValueError, match=r"down_proj: this rank's input columns start at 44, .* 4-wide groups"
    ):
        build_model(ModelConfig.from_pretrained(tmp_path / "fp8"), ctx)


def test_dummy_fp8_weights_and_an_fp8_kv_cache(llama_fp8):
    """load_format="dummy" fills e4m3 weights and scales (benchmarks); an fp8 KV cache works beside them."""
    llm = LLM(
        llama_fp8 / "fp8", kernel_backend="torch", dtype="float32", load_format="dummy", kv_cache_dtype="fp8"
    )
    out = llm.generate(
        [{"prompt_token_ids": PROMPTS[0]}], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True)
    )
    assert len(out[0].outputs[0].token_ids) == 4
    weights = [p for n, p in llm.engine.runner.model.named_parameters() if n.endswith("qkv_proj.weight")]
    assert weights and all(w.dtype == torch.float8_e4m3fn and w.float().abs().max() > 100 for w in weights)


def test_an_fp8_mtp_draft_speculates_to_the_plain_tokens(tmp_path):
    """DeepSeek-V3 trained with its MTP layer, then quantized (the MTP layer's attention and experts too,
    as the published checkpoint has them): speculation with the fp8 draft gives the plain greedy tokens and
    the quantized draft still predicts well."""
    from core_fixtures.checkpoints import deepseek_mtp_checkpoint

    deepseek_mtp_checkpoint(tmp_path / "original", train_steps=400)
    quantized = quantize_checkpoint(tmp_path / "original", tmp_path / "fp8", (32, 32))
    assert any(name.startswith("model.layers.3.mlp.experts.") for name in quantized)  # the MTP layer's
    prompts = [[(3 * i + 1) % 200 + 2 for i in range(n)] for n in (9, 23)]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    common = dict(kernel_backend="torch", dtype="float32", block_size=4, num_kv_blocks=64)
    plain = LLM(tmp_path / "fp8", **common).generate([{"prompt_token_ids": p} for p in prompts], params)
    llm = LLM(tmp_path / "fp8", speculative_config={"method": "mtp", "num_speculative_tokens": 2}, **common)
    spec = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    assert [o.outputs[0].token_ids for o in spec] == [o.outputs[0].token_ids for o in plain]
    assert llm.engine.stats.num_accepted_tokens > 0.5 * llm.engine.stats.num_draft_tokens


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


@pytest.mark.gpu(reason="the fp8 kernels in bf16 need a GPU")
def test_bf16_on_the_gpu_is_within_the_fp8_error(checkpoints, monkeypatch):
    """bf16 with the Triton kernels (W8A8 GEMM for the 37-row prefill, weight-only fp8 experts): the logits'
    distance to the dequantized model stays below the distance fp8 weight quantization itself moved them
    (activations quantized to e4m3 add an error of that order; H200: 0.79x, 0.85x, 0.65x, 0.72x for the four
    cases); the engine then decodes through CUDA graphs (the weight-streaming fp8 kernels)."""
    from atom_kernels import settings
    from atom_kernels.settings import Settings

    monkeypatch.setattr(settings, "SETTINGS", Settings(None, False))  # kernels chosen by device: Triton
    path, dequantized, original = checkpoints
    got = torch.cat(
        ragged_prefill_logits(path, PROMPTS, device="cuda", dtype="bfloat16", block_size=16)
    ).cpu()
    with torch.no_grad():
        ref = torch.cat([dequantized(torch.tensor([p])).logits[0] for p in PROMPTS])
        unquantized = torch.cat([original(torch.tensor([p])).logits[0] for p in PROMPTS])
    error, fp8_error = _rel(got, ref), _rel(unquantized, ref)
    print(f"bf16 GPU vs dequantized: {error:.4f}; fp8 quantization itself: {fp8_error:.4f}")
    assert error < fp8_error
    llm = LLM(path, dtype="bfloat16", max_model_len=128, max_num_seqs=4, num_kv_blocks=64)
    outs = llm.generate(
        [{"prompt_token_ids": p} for p in PROMPTS],
        SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True),
    )
    assert all(len(o.outputs[0].token_ids) == STEPS for o in outs)


def test_modules_to_not_convert_names_modules_and_parents_under_any_wrapper():
    from atom_core.quantization import Fp8BlockConfig

    config = Fp8BlockConfig.from_hf(
        "X",
        dict(
            quant_method="fp8",
            weight_block_size=[128, 128],
            modules_to_not_convert=["model.language_model.layers.3.mlp", "mtp", "lm_head"],
        ),
    )
    for wrapper in ("", "atom."):
        assert config.is_skipped(f"{wrapper}model.layers.3.mlp.down_proj")
        assert config.is_skipped(f"{wrapper}model.layers.3.mlp.gate_up_proj", ("gate_proj", "up_proj"))
        assert config.experts_block(f"{wrapper}model.layers.3.mlp.experts") is None
        assert config.is_skipped(f"{wrapper}mtp.layers.0.self_attn.o_proj")
        assert not config.is_skipped(f"{wrapper}model.layers.13.mlp.down_proj")
        assert config.experts_block(f"{wrapper}model.layers.4.mlp.experts") == (128, 128)


def test_transformers_fp8_config_defaults_are_accepted_and_other_values_refused():
    from atom_core.quantization import Fp8BlockConfig

    base = dict(quant_method="fp8", weight_block_size=[128, 128])
    written = dict(base, scale_fmt="float", dequantize=False, modules_to_convert=None)  # FineGrainedFP8Config
    assert Fp8BlockConfig.from_hf("X", written).block == (128, 128)
    assert Fp8BlockConfig.from_hf("X", dict(base, scale_fmt="ue8m0")).pow2_act_scales
    with pytest.raises(ConfigError, match=r"dequantize=True is not supported"):
        Fp8BlockConfig.from_hf("X", dict(base, dequantize=True))
    with pytest.raises(ConfigError, match=r"modules_to_convert=\['q_proj'\] is not supported"):
        Fp8BlockConfig.from_hf("X", dict(base, modules_to_convert=["q_proj"]))


def test_an_fp8_tensor_of_another_format_is_named(llama_fp8):
    path = _copy(llama_fp8, "e5m2")
    name = "model.layers.0.self_attn.q_proj.weight"
    edit_checkpoint(path, lambda t: t.__setitem__(name, t[name].float().to(torch.float8_e5m2)))
    with pytest.raises(WeightLoadError, match=rf"{name}' is torch.float8_e5m2; .* holds torch.float8_e4m3fn"):
        _load(path)
