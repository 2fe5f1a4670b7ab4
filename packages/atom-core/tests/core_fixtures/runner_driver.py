"""RunnerDriver: the engine's own ModelRunner, stepped by hand (the scheduler's part reduced to block tables).

The runner builds and loads the model from the checkpoint, plans and allocates its caches, and runs each
forward with the metadata every cache kind needs; the driver only hands out block ids (a seeded permutation,
so block tables are not contiguous), keeps each sequence's length and state slot, and asks for the logits of
every token row. Tests import it as `from core_fixtures.runner_driver import RunnerDriver` (conftest.py puts this
directory on sys.path).
"""

from __future__ import annotations

import torch

# What the parity tests run with unless they ask otherwise: small pages (so prompts span several), room for
# a few sequences of a few hundred tokens, eager forwards (a CUDA device would capture decode graphs).
DEFAULTS = dict(block_size=4, num_kv_blocks=96, enforce_eager=True)
# the GPU parity tests' engine: bf16 through the Triton kernels, eager steps as transformers runs them
# (test_cuda_graphs.py covers graph replays); 256 blocks of 16 hold 4096 tokens
GPU_BF16 = dict(device="cuda", dtype="bfloat16", kernel_backend="triton", block_size=16, num_kv_blocks=256)


class RunnerDriver:
    """RunnerDriver(checkpoint, seed=0, device="cpu", **engine_options): a ModelRunner over the checkpoint
    for EngineConfig(model=checkpoint, **DEFAULTS, **engine_options); kernel_backend is "torch" on the CPU
    unless asked (left to atom-kernels, the CPU would run the Triton interpreter these tests turn on)."""

    def __init__(self, checkpoint, *, seed: int = 0, device: str | torch.device = "cpu", **engine_options):
        from atom_core.config import ModelConfig, ParallelConfig
        from atom_core.engine import EngineConfig
        from atom_core.engine.execution.model_runner import ModelRunner

        device = torch.device(device)
        if device.type == "cpu":
            engine_options.setdefault("kernel_backend", "torch")
        engine = EngineConfig(model=checkpoint, device=str(device), **{**DEFAULTS, **engine_options})
        self.config = ModelConfig.from_pretrained(checkpoint, dtype=engine.dtype)
        self.runner = ModelRunner(self.config, engine, parallel=ParallelConfig(), device=device)
        self.model, self.caches, self.plan = self.runner.model, self.runner.caches, self.runner.plan
        generator = torch.Generator().manual_seed(seed)
        self.free = torch.randperm(self.plan.num_blocks, generator=generator).tolist()
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self.state_slots: dict[int, int] = {}  # models with state layers: one running slot per sequence

    def step(self, new_tokens: dict[int, list[int]]) -> dict[int, torch.Tensor]:
        """Append tokens to sequences (new ids start new sequences); returns each one's logits [n, V]."""
        from atom_core.engine.execution.step_inputs import StepInputs

        inputs = StepInputs([], [], [], [], [], [], [], [], [])
        for seq, tokens in new_tokens.items():
            start = self.lengths.get(seq, 0)
            end = self.lengths[seq] = start + len(tokens)
            table = self.tables.setdefault(seq, [])
            while len(table) * self.plan.block_size < end:
                table.append(self.free.pop())
            slot = self.state_slots.setdefault(seq, len(self.state_slots)) if self.plan.has_state else -1
            inputs.ids += tokens
            inputs.positions += range(start, end)
            inputs.query_lens.append(len(tokens))
            inputs.seq_lens.append(end)
            inputs.block_tables.append(list(table))
            inputs.state_slots.append(slot)
            inputs.fresh.append(start == 0)
        inputs.ends = list(range(len(new_tokens)))  # every sequence's tokens are all known
        inputs.logit_rows = list(range(len(inputs.ids)))  # every row's logits, not only the last of each
        logits = self.runner.run(inputs).logits
        # a copy: a step replayed in a CUDA graph returns a view of the buffer the next replay overwrites
        return dict(zip(new_tokens, logits.clone().split(inputs.query_lens), strict=True))

    def greedy(self, prompts: list[list[int]], steps: int) -> tuple[dict[int, torch.Tensor], list[list[int]]]:
        """Prefill all prompts in one batch, then decode all together; returns prefill logits and new tokens."""
        prefill = self.step(dict(enumerate(prompts)))
        generated = [[int(prefill[i][-1].argmax())] for i in range(len(prompts))]
        for _ in range(steps - 1):
            logits = self.step({i: [g[-1]] for i, g in enumerate(generated)})
            for i, g in enumerate(generated):
                g.append(int(logits[i][-1].argmax()))
        return prefill, generated
