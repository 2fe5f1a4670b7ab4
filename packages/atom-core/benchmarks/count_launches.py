"""What one forward launches on a GPU, counted on the CPU: torch ops that run a kernel plus Triton kernels.

  python -m benchmarks run count_launches [-- --tokens 64]

A prefill that is host-bound (issue 52: ~4,000 launches for 64 tokens of the hybrid) costs about a launch's
host time per launch, so the count is the lever. Tiny Qwen3.5-MoE (tools/testing_qwen.py: two GDN and two
attention layers, 64 experts, top-8), fp16, the Triton path through the CPU interpreter; the counts are the
GPU path's (the host code is the same), by op and by the file that launched it. One prompt of --tokens
tokens to its first token (forwards: one, as the state at the last full block, which prefix caching
keeps, is taken inside the forward; earlier records show two, the prefill having stopped at that block),
then one decode step (eager: a graph replays the decode's launches, it does not remove them).
"""

from __future__ import annotations

import os

os.environ.setdefault("TRITON_INTERPRET", "1")  # before the first @triton.jit: the CPU runs Triton kernels

import argparse
import collections
import tempfile
import traceback
from pathlib import Path

import triton.runtime.interpreter as interpreter
from torch.utils._python_dispatch import TorchDispatchMode

from atom_core.engine import LLM, SamplingParams
from atom_core.engine.execution.model_runner import ModelRunner
from tools.testing_qwen import qwen3_next_checkpoint

# torch ops that launch nothing on a GPU: views, metadata and allocation (counted apart)
NO_KERNEL = {
    "view", "_unsafe_view", "reshape", "_reshape_alias", "as_strided", "slice", "select", "unsqueeze",
    "squeeze", "t", "transpose", "permute", "expand", "alias", "detach", "split", "split_with_sizes",
    "unbind", "narrow", "chunk", "unfold", "lift_fresh", "is_nonzero", "item", "_local_scalar_dense", "detach_",
    "set_", "resize_",
}  # fmt: skip
ALLOCATIONS = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}


class LaunchCount(TorchDispatchMode):
    """Counts kernel-running torch ops and Triton launches (not the interpreter's own torch calls)."""

    def __init__(self):
        super().__init__()
        self.ops: collections.Counter[str] = collections.Counter()
        self.sites: collections.Counter[str] = collections.Counter()
        self.allocations = 0
        self.inside_triton = 0
        self.forwards = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        out = func(*args, **(kwargs or {}))
        if not self.inside_triton:
            if name in ALLOCATIONS:
                self.allocations += 1
            elif name not in NO_KERNEL and not (name == "to" and out is args[0]):  # a no-op conversion
                self.count(name)
        return out

    def count(self, name: str) -> None:
        self.ops[name] += 1
        ours = [f for f in traceback.extract_stack()[:-2] if "/atom_" in f.filename]
        if ours:
            self.sites[f"{ours[-1].filename.rsplit('/src/', 1)[-1]}:{ours[-1].lineno}"] += 1

    def triton_launch(self, run):
        def counted(fn_self, *args, **kwargs):
            self.count("triton:" + fn_self.fn.__name__)
            self.inside_triton += 1
            try:
                return run(fn_self, *args, **kwargs)
            finally:
                self.inside_triton -= 1

        return counted


def _count(llm: LLM, prompts: list[list[int]], max_tokens: int) -> LaunchCount:
    counter = LaunchCount()
    run, forward = interpreter.InterpretedFunction.run, ModelRunner._forward

    def counted_forward(*args, **kwargs):
        counter.forwards += 1
        return forward(*args, **kwargs)

    interpreter.InterpretedFunction.run = counter.triton_launch(run)
    ModelRunner._forward = counted_forward
    try:
        with counter:
            llm.generate([{"prompt_token_ids": p} for p in prompts], SamplingParams(max_tokens=max_tokens))
    finally:
        interpreter.InterpretedFunction.run, ModelRunner._forward = run, forward
    return counter


def _summary(counter: LaunchCount) -> dict:
    triton = sum(n for k, n in counter.ops.items() if k.startswith("triton:"))
    return dict(
        forwards=counter.forwards,
        launches=sum(counter.ops.values()),
        triton=triton,
        torch=sum(counter.ops.values()) - triton,
        allocations=counter.allocations,
        top_ops=dict(counter.ops.most_common(25)),
        top_sites=dict(counter.sites.most_common(25)),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--tokens", type=int, default=64, help="the prompt's tokens (at most 250)")
    args = parser.parse_args()
    path = Path(tempfile.mkdtemp())
    qwen3_next_checkpoint(path, "qwen3.5-moe", num_experts=64, num_experts_per_tok=8)
    llm = LLM(path, kernel_backend="triton", dtype="float16", enforce_eager=True, max_model_len=256)
    prompt = [(7 * i) % 190 + 2 for i in range(args.tokens)]
    warm = [(11 * i) % 190 + 2 for i in range(args.tokens)]  # compiles; another prompt: no prefix hit
    _count(llm, [warm], 2)
    prefill = _summary(_count(llm, [prompt], 1))
    both = _summary(_count(llm, [[p + 1 for p in prompt]], 2))
    decode = {k: both[k] - prefill[k] for k in ("forwards", "launches", "triton", "torch", "allocations")}
    rows = [
        dict(forward="prefill", tokens=args.tokens, **prefill),
        dict(forward="decode", tokens=1, **decode),
    ]
    for row in rows:
        print({k: v for k, v in row.items() if not k.startswith("top_")}, flush=True)
    return dict(model="tiny qwen3.5-moe (2 GDN + 2 attention layers, 64 experts, top-8), fp16", rows=rows)


if __name__ == "__main__":
    main()
