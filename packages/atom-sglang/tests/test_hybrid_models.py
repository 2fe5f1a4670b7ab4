"""Qwen3-Next and Qwen3.5 (Gated DeltaNet beside gated full attention) inside SGLang's real hybrid pieces on
the CPU: SGLang's own config classes, HybridReqToTokenPool with its MambaPool, HybridLinearKVPool, and the
HybridLinearAttnBackend SGLang builds for these models (the `atom` backend on the full-attention layers,
SGLang's GDN backend's metadata for ATOM's GDN layers), against transformers' logits and greedy tokens."""

from collections import Counter
from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_harness import SglangHarness, assert_generation_matches, generate

from tools.testing_qwen import qwen3_next_checkpoint
from tools.testing_seams import record_steps

CASES = {
    "qwen3-next": "Qwen3NextForCausalLM",
    "qwen3.5": "Qwen3_5ForCausalLM",
    "qwen3.5-moe": "Qwen3_5MoeForCausalLM",
    "qwen3.5-conditional-generation": "Qwen3_5ForConditionalGeneration",
}


# SGLang 0.5.23's Qwen3-Next config places full attention by full_attention_interval (the published
# checkpoints carry it); transformers' by layer_types. tools/testing_qwen's layers alternate: interval 2.
SGLANG_FIELDS = dict(full_attention_interval=2)


def _prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 200, (n,), generator=g).tolist() for n in (5, 19, 37)]


def _reference_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].float()


@pytest.mark.parametrize("case", list(CASES))
def test_hybrid_wrapper_matches_transformers_through_extend_and_decode(case, tmp_path):
    reference = qwen3_next_checkpoint(tmp_path, case, **SGLANG_FIELDS)
    h = SglangHarness(tmp_path, page_size=16)
    assert type(h.model).__name__ == CASES[case]
    assert type(h.backend).__name__ == "HybridLinearAttnBackend"
    assert type(h.backend.full_attn_backend).__name__ == "AtomAttnBackend"
    assert h.loaded == set(dict(h.model.named_parameters()))
    prompts = _prompts(seed=len(case))
    tokens, logits = generate(h, prompts)
    assert_generation_matches(lambda t: _reference_logits(reference, t), prompts, tokens, logits)


@pytest.mark.parametrize("heads", [(48, 24), (96, 192)], ids=["dk48-dv24", "dk96-dv192"])
def test_gdn_heads_that_are_not_powers_of_two_match_transformers(tmp_path, heads):
    """Key and value heads that are not powers of two (ATOM's kernels pad them to powers of two and mask
    the padding) through SGLang's extend and decode."""
    dk, dv = heads
    reference = qwen3_next_checkpoint(
        tmp_path, "qwen3-next", linear_key_head_dim=dk, linear_value_head_dim=dv, **SGLANG_FIELDS
    )
    h = SglangHarness(tmp_path, page_size=16)
    prompts = _prompts(seed=7)
    tokens, logits = generate(h, prompts)
    assert_generation_matches(lambda t: _reference_logits(reference, t), prompts, tokens, logits)


def test_an_fp8_qwen3_5_moe_matches_transformers_on_the_dequantized_weights(tmp_path, monkeypatch):
    """Qwen3.5-MoE's fp8 release format: 32-wide blocks over a 48-wide hidden (ragged), bf16 scales, the GDN
    gate projections in modules_to_not_convert. atom-kernels' torch path (the CPU interpreter's e4m3 math is
    wrong, and W8A8 is not the dequantized model)."""
    from transformers import AutoModelForCausalLM

    from atom_kernels import settings
    from atom_kernels.settings import Backend, Settings
    from tools.testing_fp8 import dequantized_copy, quantize_checkpoint

    monkeypatch.setattr(settings, "SETTINGS", Settings(Backend.TORCH, settings.SETTINGS.triton_interpret))
    qwen3_next_checkpoint(tmp_path / "original", "qwen3.5-moe", **SGLANG_FIELDS)
    fp8, dequantized = tmp_path / "fp8", tmp_path / "dequantized"
    quantize_checkpoint(
        tmp_path / "original", fp8, (32, 32), scale_dtype=torch.bfloat16, with_not_convert=True
    )
    dequantized_copy(fp8, dequantized)
    reference = AutoModelForCausalLM.from_pretrained(dequantized, dtype=torch.float32).eval()
    h = SglangHarness(fp8, page_size=16)
    attention = h.model.atom.model.layers[1].self_attn
    assert type(attention.qkv_proj.quant_method).__name__ == "Fp8BlockLinearMethod"
    prompts = _prompts(seed=3)
    tokens, logits = generate(h, prompts)
    assert_generation_matches(lambda t: _reference_logits(reference, t), prompts, tokens, logits)


def test_the_radix_cache_must_be_off(tmp_path):
    # SGLang's mamba radix cache snapshots GDN states inside its own GDN kernels, which ATOM's layers
    # replace: a prefix hit would resume from a state nobody saved. Refused at model construction.
    from sglang.srt.runtime_context import get_context

    qwen3_next_checkpoint(tmp_path, "qwen3-next", **SGLANG_FIELDS)
    h = SglangHarness(tmp_path, page_size=16)
    kit_args = h.runner._server_args_override
    kit_args.restore()
    radix_on = get_context().override_server_args(**{**kit_args._fields, "disable_radix_cache": False})
    try:
        with radix_on, pytest.raises(NotImplementedError, match="launch with --disable-radix-cache"):
            type(h.model)(h.hf_config)
    finally:
        kit_args.install()


def _bound(h, batch):
    """A forward's scope as the wrapper opens it: SGLang's backend published, the batch bound for ATOM."""
    import contextlib

    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

    from atom_sglang.runtime import sglang_forward

    stack = contextlib.ExitStack()
    stack.enter_context(forward_context(ForwardContext(attn_backend=h.backend)))
    stack.enter_context(sglang_forward(batch))
    return stack


@pytest.mark.parametrize("case", ["qwen3-next", "qwen3.5-moe"])
def test_chain_verify_keeps_every_drafted_state_for_sglangs_commit(case, tmp_path, monkeypatch):
    # The seam: every GDN step reaches atom-core's gdn_step, the verify as SGLang's scratch rows.
    import atom_sglang.attention.gdn as gdn

    steps = record_steps([gdn], Counter(), monkeypatch.setattr)
    # SGLang's EAGLE worker verifies n drafted tokens per request, then commits the state after the last
    # accepted one from its speculative scratch (update_mamba_state_after_mtp_verify), then decodes on.
    reference = qwen3_next_checkpoint(tmp_path, case, **SGLANG_FIELDS)
    h = SglangHarness(tmp_path, page_size=16, verify_tokens=3)
    prompts = _prompts(seed=9)[:2]
    reqs = [h.add(p) for p in prompts]
    last = h.extend([(r, p) for r, p in zip(reqs, prompts, strict=True)])
    greedy = [int(row.argmax()) for row in last]
    truth = [
        _reference_logits(reference, [*p, g]).argmax(-1)[-1].item()
        for p, g in zip(prompts, greedy, strict=True)
    ]
    # request 0 drafts its two greedy tokens then a wrong one (2 accepted); request 1 is wrong at once
    drafts = [[greedy[0], truth[0], 3], [greedy[1], (truth[1] + 1) % 200 + 2, 4]]
    rows = h.verify([(r, d) for r, d in zip(reqs, drafts, strict=True)]).view(2, 3, -1)
    for prompt, draft, mine in zip(prompts, drafts, rows, strict=True):
        ref = _reference_logits(reference, prompt + draft)[len(prompt) : len(prompt) + 3]
        torch.testing.assert_close(mine, ref, atol=1e-4 * float(ref.abs().max()), rtol=1e-4)
    accepted = [2, 1]  # drafted tokens each request keeps
    _commit(h, torch.tensor([a - 1 for a in accepted]))
    bonus = []
    for req, prompt, draft, keep, mine in zip(reqs, prompts, drafts, accepted, rows, strict=True):
        req.tokens = prompt + draft[:keep]
        bonus.append(int(mine[keep - 1].argmax()))
    after = h.decode(list(zip(reqs, bonus, strict=True)))
    for prompt, draft, keep, token, mine in zip(prompts, drafts, accepted, bonus, after, strict=True):
        ref = _reference_logits(reference, prompt + draft[:keep] + [token])[-1]
        torch.testing.assert_close(mine, ref, atol=1e-4 * float(ref.abs().max()), rtol=1e-4)
    kinds = ("gdn_step:GDNStepView", "gdn_step:GDNScratchVerify")
    assert set(steps) == set(kinds) and all(steps[k] > 0 for k in kinds), steps


def _commit(h, last_correct_step: torch.Tensor) -> None:
    """SGLang's post-verify commit (HybridLinearAttnBackend.update_mamba_state_after_mtp_verify): every
    layer's state slot <- its batch row's scratch state after the last accepted step. Its fused scatter
    kernel is CUDA-only; this is the CPU form SGLang keeps beside it (_scatter_speculative_state_with_mask)."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import HybridLinearAttnBackend

    scatter = HybridLinearAttnBackend._scatter_speculative_state_with_mask
    caches = h.runner.req_to_token_pool.get_speculative_mamba2_params_all_layers()
    slots = h.backend.linear_attn_backend.forward_metadata.mamba_cache_indices[: last_correct_step.numel()]
    scatter(caches.temporal, caches.intermediate_ssm, slots, last_correct_step)
    for conv, window in zip(caches.conv, caches.intermediate_conv_window, strict=True):
        scatter(conv, window, slots, last_correct_step)


def test_tree_verify_of_a_hybrid_is_refused_by_name(tmp_path):
    import dataclasses

    qwen3_next_checkpoint(tmp_path, "qwen3-next", **SGLANG_FIELDS)
    h = SglangHarness(tmp_path, page_size=16)
    req = h.add([5, 6, 7])
    h.extend([(req, [5, 6, 7])])
    layer = h.model.atom.model.layers[0].linear_attn.core
    spec = layer.spec
    decode = h._batch(ForwardMode.DECODE, [req], [8], [3], [h._slot(req, 3)], [4])
    h.backend.init_forward_metadata(decode)  # metadata SGLang's GDN backend built for a batch of 1
    verify = dataclasses.replace(decode, forward_mode=ForwardMode.TARGET_VERIFY)
    verify.spec_info = SimpleNamespace(topk=2, draft_token_num=1)
    mixed = torch.zeros(1, spec.conv_dim)
    heads = torch.zeros(1, spec.num_v_heads)
    weights = (
        torch.zeros(spec.conv_dim, spec.conv_width),
        torch.zeros(spec.num_v_heads),
        torch.zeros(spec.num_v_heads),
    )
    with _bound(h, verify), pytest.raises(NotImplementedError, match="chain drafts only"):
        layer(mixed, heads, heads, *weights)


def test_a_multimodal_layout_needs_language_model_only(tmp_path):
    from sglang.srt.configs.model_config import ModelConfig

    from atom_sglang.wrapper import entry_class

    qwen3_next_checkpoint(tmp_path, "qwen3.5-conditional-generation", **SGLANG_FIELDS)
    config = ModelConfig(str(tmp_path)).hf_config  # launched without --language-model-only
    with pytest.raises(ValueError, match="serves text only: launch with --language-model-only"):
        entry_class("Qwen3_5ForConditionalGeneration")(config)


def test_under_language_model_only_sglang_answers_an_image_request_with_a_400():
    """SGLang's own request check under the required flag: a ValueError from the TokenizerManager, which
    its HTTP and OpenAI routes answer with 400 before anything reaches the scheduler."""
    import asyncio

    from sglang.srt.managers.io_struct import GenerateReqInput
    from sglang.srt.managers.tokenizer_manager import TokenizerManager
    from sglang.srt.runtime_context import get_context

    request = GenerateReqInput(input_ids=[5, 6, 7], image_data="data:image/png;base64,AAAA")
    refused = pytest.raises(
        ValueError, match="Multimodal inputs are not supported when --language-model-only"
    )
    with get_context().override_server_args(language_model_only=True), refused:
        asyncio.run(TokenizerManager._tokenize_one_request(SimpleNamespace(), request))


def test_a_batch_with_images_is_still_refused_by_name(tmp_path):
    """Unreachable under the required flag; the model never drops media it was handed."""
    qwen3_next_checkpoint(tmp_path, "qwen3.5-conditional-generation", **SGLANG_FIELDS)
    h = SglangHarness(tmp_path, page_size=16)
    req = h.add([5, 6, 7])
    batch = h._extend_batch([(req, [5, 6, 7])], ForwardMode.EXTEND)
    # what SGLang's MultimodalInputs answers for a request with an image
    image = SimpleNamespace(
        contains_image_inputs=lambda: True,
        contains_video_inputs=lambda: False,
        contains_audio_inputs=lambda: False,
    )
    batch.mm_inputs = [image]
    with pytest.raises(NotImplementedError, match="served text-only"):
        h.run(batch)
