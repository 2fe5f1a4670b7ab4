"""GPT-OSS from an MXFP4 checkpoint in the published layout (experts as `*_blocks` [E, N, K / 32, 16] and
`*_scales` [E, N, K / 32], gate and up rows alternating), written by atom-kernels' quantizer: transformers
reads it back (dequantizing, as it does without a GPU) and the engine must equal that model; bad
checkpoints and configs are named."""

import json

import pytest
import torch
from core_fixtures.architectures import GPT_OSS_TINY
from core_fixtures.checkpoints import gpt_oss_extras
from core_fixtures.references import swiglu_as_configured
from core_fixtures.runner_driver import RunnerDriver
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, GptOssConfig

from atom_core import LLM
from atom_core.config import ConfigError, ModelConfig
from atom_core.loader import CheckpointError
from atom_core.models.weights import WeightLoadError
from atom_core.ops import dequantize_mxfp4
from atom_core.quantization import quant_config_for
from tools.testing_models import random_checkpoint
from tools.testing_mxfp4 import MXFP4
from tools.testing_mxfp4 import mxfp4_checkpoint as write_mxfp4

CONFIG = dict(GPT_OSS_TINY, intermediate_size=64)  # 32 per rank at tensor parallel 2: whole groups


@pytest.fixture(scope="module")
def mxfp4_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpt-oss-mxfp4")
    _, bf16 = random_checkpoint(GptOssConfig(**CONFIG), root / "bf16", edit=gpt_oss_extras)
    return write_mxfp4(bf16, root / "mxfp4")


def test_the_quantizers_layout_is_the_one_transformers_dequantizes(mxfp4_checkpoint):
    from transformers.integrations.mxfp4 import convert_moe_packed_tensors

    tensors = load_file(mxfp4_checkpoint / "model.safetensors")
    blocks = tensors["model.layers.0.mlp.experts.gate_up_proj_blocks"]
    scales = tensors["model.layers.0.mlp.experts.gate_up_proj_scales"]
    theirs = convert_moe_packed_tensors(blocks, scales, dtype=torch.float32)  # [E, in, out]
    ours = dequantize_mxfp4(blocks.flatten(-2), scales, torch.float32)  # [E, out, in]
    torch.testing.assert_close(ours.transpose(1, 2), theirs, rtol=0, atol=0)


def _hf_from_mxfp4(path):
    """transformers' model read from the MXFP4 checkpoint, dequantized (its CPU path). It dequantizes the
    experts to bf16, which holds every e2m1 value times its power-of-two scale exactly: in fp32 they are
    the same weights, and the model computes in fp32 like the engine here."""
    from transformers import Mxfp4Config

    config = Mxfp4Config(dequantize=True, modules_to_not_convert=MXFP4["modules_to_not_convert"])
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, quantization_config=config)
    return swiglu_as_configured(model.float().eval())


def test_engine_equals_transformers_on_the_mxfp4_checkpoint(mxfp4_checkpoint, hf_greedy_tokens):
    hf = _hf_from_mxfp4(mxfp4_checkpoint)
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(1, 211, (n,), generator=gen).tolist() for n in (13, 4, 19)]
    for backend in ("torch", "triton"):  # the reference, then the kernels unpacking the bytes
        driver = RunnerDriver(mxfp4_checkpoint, kernel_backend=backend)
        experts = driver.model.model.layers[0].mlp
        assert experts.w13.dtype == torch.uint8 and experts.w13_mxfp4_scale.shape == (4, 128, 2)
        prefill, generated = driver.greedy(prompts, steps=16 if backend == "torch" else 4)
        for i, prompt in enumerate(prompts):
            with torch.no_grad():
                ref = hf(torch.tensor([prompt])).logits[0]
            scale = max(ref.abs().max().item(), 1.0)
            torch.testing.assert_close(prefill[i], ref, rtol=0, atol=1e-4 * scale)
            assert generated[i] == hf_greedy_tokens(hf, prompt, len(generated[i])), f"{backend}: prompt {i}"


def test_experts_listed_as_not_converted_load_in_the_models_dtype(tmp_path, mxfp4_checkpoint):
    """modules_to_not_convert naming one layer's experts keeps them unquantized: that layer loads the
    transformers layout, the others MXFP4."""
    src = mxfp4_checkpoint.parent / "bf16"
    bf16 = load_file(src / "model.safetensors")

    def keep_layer_1(tensors):
        for name in ("gate_up_proj", "down_proj"):
            key = f"model.layers.1.mlp.experts.{name}"
            del tensors[f"{key}_blocks"], tensors[f"{key}_scales"]
            tensors[key] = bf16[key]

    path = write_mxfp4(src, tmp_path / "mixed", edit=keep_layer_1)
    config = json.loads((path / "config.json").read_text())
    config["quantization_config"]["modules_to_not_convert"].append("model.layers.1.mlp.experts")
    (path / "config.json").write_text(json.dumps(config))
    layers = RunnerDriver(path).model.model.layers
    assert layers[0].mlp.w13.dtype == torch.uint8 and layers[1].mlp.w13.dtype == torch.float32


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (
            lambda t: t.pop("model.layers.2.mlp.experts.down_proj_scales"),
            r"missing tensors for: model\.layers\.2\.mlp\.w2_mxfp4_scale",
        ),
        (
            lambda t: t.update(
                {
                    "model.layers.0.mlp.experts.gate_up_proj_scales": t[
                        "model.layers.0.mlp.experts.gate_up_proj_scales"
                    ][..., :1]
                }
            ),
            r"gate_up_proj_scales.*expected MXFP4 scales of shape \(4, 128, 2\)",
        ),
        (
            lambda t: t.update(
                {
                    "model.layers.0.mlp.experts.down_proj_blocks": t[
                        "model.layers.0.mlp.experts.down_proj_blocks"
                    ].float()
                }
            ),
            r"down_proj_blocks' is torch\.float32, where .* holds torch\.uint8 codes",
        ),
        (  # scales stored like blocks: the parameter, not the tensor's rank, says what is expected
            lambda t: t.update(
                {
                    "model.layers.0.mlp.experts.down_proj_scales": t[
                        "model.layers.0.mlp.experts.down_proj_blocks"
                    ].clone()
                }
            ),
            r"down_proj_scales.*expected MXFP4 scales of shape \(4, 64, 2\)",
        ),
        (  # e8m0's NaN: past the scales the kernels take
            lambda t: t["model.layers.1.mlp.experts.gate_up_proj_scales"].view(-1)[5:6].fill_(255),
            r"gate_up_proj_scales.*hold the byte 255 \(2\*\*128\); the kernels take scales up to byte 240",
        ),
    ],
    ids=[
        "a missing scale",
        "a scale of the wrong shape",
        "blocks of the wrong dtype",
        "scales as blocks",
        "a scale out of range",
    ],
)
def test_bad_mxfp4_checkpoints_are_named(tmp_path, mxfp4_checkpoint, edit, message):
    path = write_mxfp4(mxfp4_checkpoint.parent / "bf16", tmp_path / "bad", edit=edit)
    with pytest.raises((WeightLoadError, CheckpointError), match=message):
        LLM(path, kernel_backend="torch")


@pytest.mark.parametrize(
    ("quantization", "message"),
    [
        (
            dict(MXFP4, modules_to_not_convert=["model.layers.[0-3].self_attn"]),
            "entry 'model.layers.\\[0-3\\]",
        ),
        (dict(MXFP4, modules_to_not_convert="lm_head"), "must be a list of module paths"),
        (dict(MXFP4, group_size=16), "'group_size', which ATOM does not implement"),
    ],
)
def test_mxfp4_configs_atom_cannot_compute_are_refused_by_name(quantization, message):
    hf = {"architectures": ["GptOssForCausalLM"], **CONFIG, "quantization_config": quantization}
    with pytest.raises(ConfigError, match=message):
        quant_config_for(ModelConfig.from_hf_dict(hf))


def test_mxfp4_on_another_family_is_refused():
    hf = {"architectures": ["Qwen3MoeForCausalLM"], **CONFIG, "quantization_config": MXFP4}
    with pytest.raises(ConfigError, match="mxfp4' is implemented for the experts of GptOssForCausalLM"):
        quant_config_for(ModelConfig.from_hf_dict(hf))


def test_a_rank_share_of_experts_off_the_32_value_groups_is_refused():
    from atom_core.attention import PagedAttentionBackend
    from atom_core.build import BuildContext
    from atom_core.config import ParallelConfig
    from atom_core.loader import build_model

    hf = {
        "architectures": ["GptOssForCausalLM"],
        **CONFIG,
        "intermediate_size": 96,
        "quantization_config": MXFP4,
    }
    ctx = BuildContext(PagedAttentionBackend(kernel_backend="torch"), parallel=ParallelConfig(tp_size=2))
    with pytest.raises(
        ConfigError, match="whole 32-value scale groups, but the intermediate size on each of 2"
    ):
        build_model(ModelConfig.from_hf_dict(hf), ctx)


def test_dummy_weights_fill_mxfp4_experts_with_codes_and_a_small_scale():
    """load_format="dummy" (benchmarks at published shapes): random e2m1 codes under one scale, so the
    experts dequantize within the spread of the other dummy weights."""
    from atom_core.attention import PagedAttentionBackend
    from atom_core.build import BuildContext
    from atom_core.loader import build_model, load_checkpoint

    hf = {"architectures": ["GptOssForCausalLM"], **CONFIG, "quantization_config": MXFP4}
    model = build_model(
        ModelConfig.from_hf_dict(hf), BuildContext(PagedAttentionBackend(kernel_backend="torch"))
    )
    load_checkpoint(model, None, load_format="dummy")
    moe = model.model.layers[0].mlp
    w13 = dequantize_mxfp4(moe.w13, moe.w13_mxfp4_scale, torch.float32)
    assert w13.abs().max() <= 6 * 2**-7 and w13.std() > 0.01 and len(moe.w13.unique()) > 200
