"""On a GPU: bf16 parity with transformers at a larger config, through the Triton kernels.

bf16 noise can flip a near-tied greedy choice, so both models are teacher-forced along transformers' own
greedy tokens, and every step's logits must agree within bf16 tolerance.
"""

import pytest
import torch
from core_fixtures.runner_driver import GPU_BF16, RunnerDriver
from transformers import AutoModelForCausalLM, GptOssConfig, LlamaConfig, Qwen3Config, Qwen3MoeConfig

from tools.testing_models import random_checkpoint

pytestmark = pytest.mark.gpu(reason="bf16 + Triton parity runs on a GPU")

LARGE = dict(
    vocab_size=4096,
    hidden_size=1024,
    intermediate_size=2816,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=4,
    max_position_embeddings=4096,
)


@pytest.mark.parametrize(
    ("cls", "overrides"),
    [
        (LlamaConfig, {}),
        (Qwen3Config, dict(head_dim=128)),
        (Qwen3MoeConfig, dict(head_dim=128, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=512)),
        # windows far shorter than the prompts, on half the layers
        (Qwen3Config, dict(head_dim=128, use_sliding_window=True, sliding_window=96, max_window_layers=2)),
        # sinks, biases, alternating windows shorter than the prompts, the clamped SwiGLU experts
        (
            GptOssConfig,
            dict(
                head_dim=64,
                num_local_experts=8,
                num_experts_per_tok=2,
                intermediate_size=512,
                sliding_window=96,
            ),
        ),
    ],
)
def test_bf16_teacher_forced_parity(tmp_path, cls, overrides):
    hf = random_checkpoint(cls(**{**LARGE, **overrides}), tmp_path / "ckpt", dtype=torch.bfloat16)[0].cuda()
    if "num_experts" in overrides or "num_local_experts" in overrides:
        # Random routers (std 0.02) tie experts within bf16 noise, and a flipped expert is not a kernel
        # error: routers with the margins trained ones have, re-saved.
        with torch.no_grad():
            for name, param in hf.named_parameters():
                if name.endswith(("mlp.gate.weight", "mlp.router.weight")):
                    param.mul_(25.0)
        hf.save_pretrained(tmp_path / "ckpt")
    _teacher_forced(hf, tmp_path / "ckpt")


def test_mxfp4_gpt_oss_teacher_forced_parity(tmp_path):
    """The MXFP4 expert GEMMs in bf16 on the GPU: ATOM on the MXFP4 checkpoint against transformers on its
    dequantized copy."""
    from tools.testing_mxfp4 import dequantized_copy, mxfp4_checkpoint

    config = GptOssConfig(**LARGE, head_dim=64, num_local_experts=8, num_experts_per_tok=2, sliding_window=96)
    hf = random_checkpoint(config, tmp_path / "bf16", dtype=torch.bfloat16)[0]
    with torch.no_grad():
        for name, param in hf.named_parameters():
            if name.endswith("mlp.router.weight"):
                param.mul_(25.0)
    hf.save_pretrained(tmp_path / "bf16")
    mxfp4_checkpoint(tmp_path / "bf16", tmp_path / "mxfp4")
    dequantized_copy(tmp_path / "mxfp4", tmp_path / "dequantized")
    reference = AutoModelForCausalLM.from_pretrained(tmp_path / "dequantized", dtype=torch.bfloat16).cuda()
    _teacher_forced(reference.eval(), tmp_path / "mxfp4")


def _teacher_forced(hf, checkpoint) -> None:
    """ATOM (bf16, the Triton kernels) on checkpoint against transformers' model hf, along hf's greedy
    tokens: every step's logits within bf16 noise."""
    prompts = [torch.randint(1, 4096, (n,)).tolist() for n in (300, 77, 1000)]
    runner = RunnerDriver(checkpoint, **GPU_BF16)
    worst = 0.0
    atom = runner.step({i: p for i, p in enumerate(prompts)})
    steps = {i: list(p) for i, p in enumerate(prompts)}
    for _ in range(16):
        for i, seq in steps.items():
            with torch.no_grad():
                ref = hf(torch.tensor([seq], device="cuda")).logits[0, -1].float()
            got = atom[i][-1].float()
            worst = max(worst, ((got - ref).abs().max() / ref.abs().max()).item())
            seq.append(int(ref.argmax()))  # teacher forcing along transformers' greedy choice
        atom = runner.step({i: [seq[-1]] for i, seq in steps.items()})
    assert worst < 3e-2, f"largest logit error relative to the logit range: {worst:.3g}"
