"""ATOM's wrappers inside SGLang's real runtime pieces on the CPU (see sglang_harness.py for what is
real), through the adapter's "atom" attention backend, against transformers' logits and greedy tokens."""

from functools import partial

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang_harness import SglangHarness, assert_generation_matches, generate
from sglang_support import ARCHITECTURES, transformers_logits
from transformers import AutoConfig

from atom_core.integration import current_forward_context

STEPS = 6


def _prompts(seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 300, (n,), generator=g).tolist() for n in (5, 19, 37)]


@pytest.mark.parametrize(
    ("architecture", "page_size"),
    [(arch, 16) for arch in ARCHITECTURES] + [("LlamaForCausalLM", 1), ("Qwen3ForCausalLM", 64)],
)
def test_wrapper_matches_transformers_through_extend_and_decode(checkpoint_for, architecture, page_size):
    checkpoint = checkpoint_for(architecture)
    h = SglangHarness(checkpoint, page_size=page_size)
    assert type(h.model).__name__ == architecture
    mla = "Deepseek" in architecture  # SGLang's runner uses MLA for these: the factory picks the MLA backend
    assert type(h.backend).__name__ == ("AtomMLAAttnBackend" if mla else "AtomAttnBackend")
    assert h.loaded == set(dict(h.model.named_parameters()))  # load_weights names every parameter it filled
    prompts = _prompts(seed=len(architecture) + page_size)
    tokens, logits = generate(h, prompts)
    assert_generation_matches(partial(transformers_logits, checkpoint), prompts, tokens, logits)


def test_deepseek_runs_on_sglangs_own_mla_backend_too(checkpoint_for):
    # ATOM's MLA layer hands SGLang the latent as SGLang's DeepSeek does ([latent | rope] as k, the latent
    # as v), so SGLang's built-in MLA backends serve it: torch_native is the one that runs on the CPU.
    checkpoint = checkpoint_for("DeepseekV3ForCausalLM")
    h = SglangHarness(checkpoint, page_size=1, backend="torch_native")
    assert type(h.backend).__name__ == "TorchNativeAttnBackend"
    prompts = _prompts(seed=5)
    tokens, logits = generate(h, prompts)
    assert_generation_matches(partial(transformers_logits, checkpoint), prompts, tokens, logits)


# Windows shorter than the prompts: Qwen3 mixes full and windowed layers, Qwen3-MoE windows every layer,
# Qwen2-MoE every other one. Each layer carries its window to the backend as RadixAttention's
# sliding_window_size (q - k <= size, so one less than transformers' window).
WINDOWED = {
    "Qwen3ForCausalLM": dict(use_sliding_window=True, sliding_window=7, max_window_layers=1),
    "Qwen3MoeForCausalLM": dict(use_sliding_window=True, sliding_window=9),
    "Qwen2MoeForCausalLM": dict(use_sliding_window=True, sliding_window=6, max_window_layers=2),
}


@pytest.mark.parametrize("architecture", list(WINDOWED))
def test_windowed_layers_match_transformers_past_the_window(checkpoint_for, architecture):
    from transformers import AutoModelForCausalLM

    checkpoint = checkpoint_for(architecture, **WINDOWED[architecture])
    hf = AutoModelForCausalLM.from_pretrained(checkpoint)
    windows = [getattr(layer.self_attn, "sliding_window", None) for layer in hf.model.layers]
    h = SglangHarness(checkpoint, page_size=16)
    sizes = [layer.self_attn.attn.sliding_window_size for layer in h.model.atom.model.layers]
    assert sizes == [-1 if w is None else w - 1 for w in windows] and any(w is not None for w in windows)
    prompts = _prompts(seed=11)
    tokens, logits = generate(h, prompts)
    assert_generation_matches(partial(transformers_logits, checkpoint), prompts, tokens, logits)


@pytest.mark.parametrize(
    ("architecture", "overrides"),
    [
        ("LlamaForCausalLM", {}),
        ("Qwen3ForCausalLM", WINDOWED["Qwen3ForCausalLM"]),  # the prefix outruns the window
        ("DeepseekV3ForCausalLM", {}),  # the shared latent rows
    ],
)
def test_a_prefix_cached_request_matches_transformers(checkpoint_for, architecture, overrides):
    # SGLang's radix cache hands a new request the pages of a shared prefix: only the rest is extended.
    checkpoint = checkpoint_for(architecture, **overrides)
    h = SglangHarness(checkpoint, page_size=16)
    shared = list(range(2, 34))  # two whole pages
    first = h.add([*shared, 40, 41])
    h.extend([(first, first.prompt)])
    second = h.add([*shared, 50, 51, 52])
    second.pages = {0: first.pages[0], 1: first.pages[1]}
    for pos in range(32):
        h.runner.req_to_token_pool.req_to_token[second.index, pos] = h.runner.req_to_token_pool.req_to_token[
            first.index, pos
        ]
    second.tokens = list(shared)
    logits = h.extend([(second, [50, 51, 52])])
    ref = transformers_logits(checkpoint, second.prompt)[-1]
    torch.testing.assert_close(logits[0], ref, atol=1e-4 * float(ref.abs().max()), rtol=1e-4)


def test_target_and_draft_wrappers_interleave_without_sharing_state(checkpoint_for):
    # Two models, two pools, two backends in one process, forwards interleaved step by step, as SGLang's
    # speculative worker runs a target and its draft.
    target_ckpt, draft_ckpt = checkpoint_for("Qwen3ForCausalLM"), checkpoint_for("LlamaForCausalLM")
    target = SglangHarness(target_ckpt, page_size=16, seed=1)
    draft = SglangHarness(draft_ckpt, page_size=1, seed=2)
    prompt = _prompts(seed=7)[1]
    t_req, d_req = target.add(prompt), draft.add(prompt)
    t_last, d_last = target.extend([(t_req, prompt)])[0], draft.extend([(d_req, prompt)])[0]
    t_rows, d_rows, t_tokens, d_tokens = [t_last], [d_last], [], []
    for _ in range(STEPS):
        t_tokens.append(int(t_last.argmax()))
        d_tokens.append(int(d_last.argmax()))
        d_last = draft.decode([(d_req, d_tokens[-1])])[0]
        t_last = target.decode([(t_req, t_tokens[-1])])[0]
        t_rows.append(t_last)
        d_rows.append(d_last)
        with pytest.raises(RuntimeError, match="no ForwardContext is bound"):
            current_forward_context()  # nothing leaks out of a forward
    assert_generation_matches(
        partial(transformers_logits, target_ckpt), [prompt], [t_tokens], [torch.stack(t_rows[:-1])]
    )
    assert_generation_matches(
        partial(transformers_logits, draft_ckpt), [prompt], [d_tokens], [torch.stack(d_rows[:-1])]
    )


def test_an_idle_batch_runs_no_model_and_returns_no_rows(checkpoint_for):
    h = SglangHarness(checkpoint_for("LlamaForCausalLM"), page_size=16)
    batch = h._batch(ForwardMode.IDLE, [], [], [], [], [])
    assert h.run(batch).shape[0] == 0


@pytest.fixture
def torch_kernels(monkeypatch):
    """atom-kernels' torch path: Triton's CPU interpreter gets e4m3 arithmetic wrong, and the kernels' W8A8
    (activations quantized too) is not the dequantized model these tests compare with."""
    from atom_kernels import settings
    from atom_kernels.settings import Backend, Settings

    monkeypatch.setattr(settings, "SETTINGS", Settings(Backend.TORCH, settings.SETTINGS.triton_interpret))


@pytest.mark.parametrize(
    ("architecture", "block", "projection"),
    [
        ("LlamaForCausalLM", (16, 16), "qkv_proj"),
        ("Qwen3MoeForCausalLM", (16, 16), "qkv_proj"),
        ("DeepseekV3ForCausalLM", (32, 32), "kv_a_proj_with_mqa"),  # 48 latent rows: a ragged last block
    ],
)
def test_fp8_checkpoints_match_transformers_on_the_dequantized_weights(
    checkpoint_for, architecture, block, projection, tmp_path, torch_kernels
):
    """A block-quantized fp8 copy (several blocks per tensor): SGLang hands the wrapper its own Fp8Config,
    ATOM's layers load the e4m3 weights and scales from the checkpoint (dequantized on the CPU)."""
    from tools.testing_fp8 import dequantized_copy, quantize_checkpoint

    fp8, reference = tmp_path / "fp8", tmp_path / "dequantized"
    quantize_checkpoint(checkpoint_for(architecture), fp8, block)
    dequantized_copy(fp8, reference)
    h = SglangHarness(fp8, page_size=16)
    attention = h.model.atom.model.layers[0].self_attn
    assert type(getattr(attention, projection).quant_method).__name__ == "Fp8BlockLinearMethod"
    prompts = _prompts(seed=7)
    tokens, logits = generate(h, prompts)
    assert_generation_matches(partial(transformers_logits, reference), prompts, tokens, logits)


def test_mxfp4_gpt_oss_matches_transformers_on_the_dequantized_experts(checkpoint_for, tmp_path, monkeypatch):
    """GPT-OSS with its experts in the published MXFP4 layout (`*_blocks`, `*_scales`, quantization_config
    "mxfp4"): SGLang parses the config into its own quantization and hands it to the wrapper, which maps
    it to ATOM's method; ATOM's experts keep the e2m1 bytes (the interpreter runs the MXFP4 kernels in
    fp32) and equal transformers run on the same experts multiplied out."""
    from sglang.srt.layers import quantization
    from sglang.srt.layers.quantization.mxfp4 import Mxfp4Config

    from tools.testing_mxfp4 import dequantized_copy, mxfp4_checkpoint

    # SGLang registers "mxfp4" where it imports on CUDA (and its CPU engine); a CPU-only import leaves it
    # out, so this test registers it as the CUDA import does
    monkeypatch.setitem(quantization.QUANTIZATION_METHODS, "mxfp4", Mxfp4Config)
    mxfp4, reference = tmp_path / "mxfp4", tmp_path / "dequantized"
    mxfp4_checkpoint(checkpoint_for("GptOssForCausalLM"), mxfp4)
    dequantized_copy(mxfp4, reference)
    h = SglangHarness(mxfp4, page_size=16)
    moe = h.model.atom.model.layers[0].mlp
    assert moe.mxfp4 is not None and moe.w13.dtype == torch.uint8  # e2m1 bytes, not a dequantized copy
    prompts = _prompts(seed=11)
    tokens, logits = generate(h, prompts)
    assert_generation_matches(partial(transformers_logits, reference), prompts, tokens, logits)


def test_another_quantization_is_refused_by_name(checkpoint_for):
    from atom_sglang.models.atom import EntryClass

    class Awq:
        def get_name(self):
            return "awq"

    config = AutoConfig.from_pretrained(checkpoint_for("LlamaForCausalLM"))
    [cls] = [entry for entry in EntryClass if entry.__name__ == "LlamaForCausalLM"]
    with pytest.raises(NotImplementedError, match=r"SGLang chose quantization 'awq'"):
        cls(config, quant_config=Awq())
