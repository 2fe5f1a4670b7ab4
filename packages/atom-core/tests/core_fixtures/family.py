"""The checks every model family's parity file runs against transformers: ragged prefill logits and greedy
continuations on the torch path, the same on atom-kernels' Triton path (the interpreter on the CPU), and the
engine under pressure (core_fixtures.engine.greedy_under_pressure)."""

import torch

from core_fixtures.engine import greedy_under_pressure
from core_fixtures.references import hf_greedy
from core_fixtures.runner_driver import RunnerDriver


def prompts(seed: int, lengths, vocab: int = 211) -> list[list[int]]:
    """Random prompts of the given lengths (ids 1..vocab-1), drawn from their own generator."""
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(1, vocab, (n,), generator=gen).tolist() for n in lengths]


def assert_matches_transformers(hf, path, batch: list[list[int]], steps: int = 32, **driver) -> None:
    """ATOM's prefill logits of a ragged batch equal transformers' one prompt at a time (1e-4 of the logit
    range), and its greedy continuations of `steps` tokens are transformers'. driver: RunnerDriver options
    (kernel_backend="triton" with device=... for the kernels' path)."""
    prefill, generated = RunnerDriver(path, **driver).greedy(batch, steps=steps)
    for i, prompt in enumerate(batch):
        with torch.no_grad():
            ref = hf(torch.tensor([prompt])).logits[0]
        torch.testing.assert_close(
            prefill[i].cpu(), ref, rtol=0, atol=1e-4 * max(ref.abs().max().item(), 1.0)
        )
        assert generated[i] == hf_greedy(hf, prompt, steps), f"prompt {i} diverged from transformers"


def assert_triton_matches_transformers(hf, path, batch: list[list[int]], steps: int = 6) -> None:
    """assert_matches_transformers on atom-kernels' Triton path: the GPU where there is one, else the
    interpreter (on only where no GPU is)."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert_matches_transformers(hf, path, batch, steps, kernel_backend="triton", device=device)


def assert_engine_under_pressure(hf, path, seed: int = 3) -> None:
    """The engine over a tiny KV cache on prompts sharing a 13-token prefix (three 4-token blocks) beside a
    long and a short one: transformers' greedy answers through chunked prefill, preemption and prefix hits."""
    shared = prompts(seed, (13,))[0]
    batch = [[*shared, 7, 8], [*shared, 9], *prompts(seed + 1, (29, 2))]
    greedy_under_pressure(path, hf, lambda model, prompt, steps: hf_greedy(model, prompt, steps), batch)
