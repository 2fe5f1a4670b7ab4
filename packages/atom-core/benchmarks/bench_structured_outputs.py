"""The cost of structured outputs on a decode step, through LLM.generate: a batch where every row is held
to a JSON schema against the same batch without, and where that cost goes.

  python -m benchmarks run structured_outputs -- --vocab o200k_base.tiktoken

Llama-3-8B at its published shape, dummy bf16 weights. The grammar needs a real vocabulary, and the dummy
checkpoint has no tokenizer: --vocab takes a tiktoken BPE file (o200k_base's first 128,256 tokens stand
in for Llama-3's tiktoken vocabulary of that size; the mask's cost follows the vocabulary's trie). The
schema asks for an array of at least 200 small objects, so no row can finish within 128 tokens and every
step masks a mid-JSON state (numbers, short strings, nested arrays, punctuation). For B = 1 and 64, B fresh
512-token prompts generate 128 tokens (greedy); a step is the median wall time of LLMEngine.step in the
second half of the run. fill_ms: the host's work per step filling the rows' bitmasks (it runs while
the forward is on the GPU); apply_ms: GPU time of the mask's copy and application; emit_ms: the host's
emit stage per step (the rows' grammars advanced by their tokens, stop checks, outputs). With async
scheduling (the default on a GPU) fill and emit run while the step's forward does. ratio = step with the schema / step without. --parallel-from sets the rows
from which fills and advances go to llguidance's threads.
"""

from __future__ import annotations

import argparse
import base64
import gc
import json
import tempfile
import time

import torch

import atom_core.engine.sampling.sampler as sampler
import atom_core.engine.steps.async_step as async_step
import atom_core.engine.structured.masking as masking
from atom_core.engine import LLM, SamplingParams
from atom_core.engine.steps.emit import Emitter
from atom_core.engine.structured import Grammars, StructuredOutputsParams
from benchmarks.harness.schemas import SCHEMA
from benchmarks.harness.shapes import llama3_8b

PROMPT, NEW = 512, 128


def tiktoken_grammars(path: str, vocab_size: int) -> Grammars:
    """Grammars over a tiktoken BPE file's first vocab_size - 1 tokens (in rank order), the last id EOS."""
    from llguidance import LLTokenizer

    ranks = {}
    with open(path, "rb") as f:
        for line in f.read().splitlines():
            token, rank = line.split()
            if int(rank) < vocab_size - 1:
                ranks[base64.b64decode(token)] = int(rank)
    eos = vocab_size - 1
    vocabulary = LLTokenizer.from_tiktoken(
        encoder=ranks, special_tokens={"<|eos|>": eos}, pattern=r"\S+|\s+", eos_token=eos, n_vocab=vocab_size
    )
    return Grammars(vocabulary, vocab_size)


class Costs:
    """Times mask_disallowed's host part and its GPU part (CUDA events), and the host's emit stage
    (the rows' grammars advanced, stop checks, outputs), per call."""

    def __init__(self):
        self.fill_s, self.apply_events, self.emit_s = [], [], []
        original = sampler.mask_disallowed
        apply = Emitter.apply

        def timed_apply(emitter, produced):
            start = time.perf_counter()
            out = apply(emitter, produced)
            self.emit_s.append(time.perf_counter() - start)
            return out

        Emitter.apply = timed_apply

        def timed(logits, seqs):
            start = time.perf_counter()
            begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            begin.record()
            original(logits, seqs)
            end.record()
            self.fill_s.append(time.perf_counter() - start)
            self.apply_events.append((begin, end))

        sampler.mask_disallowed = async_step.mask_disallowed = timed  # (the synchronous draw; the async one)

    def reset(self):
        self.fill_s, self.apply_events, self.emit_s = [], [], []

    def medians(self, window: slice) -> tuple[float, float, float]:
        fill = sorted(self.fill_s[window]) or [0.0]
        apply = sorted(b.elapsed_time(e) for b, e in self.apply_events[window]) or [0.0]
        emit = sorted(self.emit_s[len(self.emit_s) // 2 : -3]) or [0.0]
        return fill[len(fill) // 2] * 1e3, apply[len(apply) // 2], emit[len(emit) // 2] * 1e3


def run(llm: LLM, batch: int, structured: bool, gen, costs: Costs) -> dict:
    vocab = llm.engine.model_config.vocab_size
    prompts = [
        {"prompt_token_ids": torch.randint(0, vocab, (PROMPT,), generator=gen).tolist()} for _ in range(batch)
    ]
    spec = StructuredOutputsParams(json=SCHEMA) if structured else None
    params = SamplingParams(temperature=0, max_tokens=NEW, ignore_eos=True, structured_outputs=spec)
    engine, times = llm.engine, []
    step = engine.step

    def timed():
        start = time.perf_counter()
        out = step()
        times.append(time.perf_counter() - start)
        return out

    engine.step, overlapped = timed, engine.stats.num_async_steps
    costs.reset()
    try:
        outs = llm.generate(prompts, params, use_tqdm=False)
    finally:
        engine.step = step
    torch.cuda.synchronize()
    window = slice(len(times) // 2, len(times) - 3)
    steady = sorted(times[window])
    fill_ms, apply_ms, emit_ms = costs.medians(slice(len(costs.fill_s) // 2, len(costs.fill_s) - 3))
    made = [len(o.outputs[0].token_ids) for o in outs]
    return dict(
        batch=batch,
        structured=structured,
        step_ms=steady[len(steady) // 2] * 1e3,
        fill_ms=fill_ms,
        apply_ms=apply_ms,
        emit_ms=emit_ms,
        steps=len(times),
        overlapped_steps=engine.stats.num_async_steps - overlapped,
        tokens_min=min(made),
        tokens_max=max(made),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", required=True, help="a tiktoken BPE file (base64 token, rank per line)")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--label", default="", help="which tree ran (kept in the record)")
    parser.add_argument(
        "--parallel-from",
        type=int,
        default=masking.PARALLEL_FROM,
        help="rows from which grammars use threads",
    )
    args = parser.parse_args()
    masking.PARALLEL_FROM = args.parallel_from
    config = llama3_8b(args.layers)
    costs, rows = Costs(), []
    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d)
        llm = LLM(d, load_format="dummy", dtype="bfloat16", max_model_len=1024, max_num_seqs=64)
        start = time.perf_counter()
        llm.engine._grammars = tiktoken_grammars(args.vocab, config.vocab_size)
        compile_start = time.perf_counter()
        llm.engine._grammars.compile(StructuredOutputsParams(json=SCHEMA))
        compile_ms = (time.perf_counter() - compile_start) * 1e3
        print(
            f"tokenizer info {compile_start - start:.2f} s, schema compiled in {compile_ms:.1f} ms",
            flush=True,
        )
        gen = torch.Generator().manual_seed(0)
        for batch in (int(b) for b in args.batches.split(",")):
            for structured in (False, True):
                run(llm, batch, structured, gen, costs)  # warm-up
                row = dict(model="llama3-8b", **run(llm, batch, structured, gen, costs))
                rows.append(row)
                print(json.dumps(row), flush=True)
        llm.shutdown()
        del llm
        gc.collect()
    for row in rows:
        if row["structured"]:
            plain = next(r for r in rows if r["batch"] == row["batch"] and not r["structured"])
            row["ratio"] = row["step_ms"] / plain["step_ms"]
    print(f"\n{torch.cuda.get_device_name()}  {args.label}  schema compile {compile_ms:.1f} ms")
    print(
        f"{'B':>4} {'schema':<7}{'step ms':>9}{'ratio':>7}{'fill ms':>9}{'apply ms':>9}{'emit ms':>9}{'overlap':>9}"
    )
    for r in rows:
        ratio = f"{r['ratio']:.3f}" if "ratio" in r else "-"
        print(f"{r['batch']:>4} {r['structured']!s:<7}{r['step_ms']:>9.3f}{ratio:>7}{r['fill_ms']:>9.3f}"
              f"{r['apply_ms']:>9.3f}{r['emit_ms']:>9.3f}{r['overlapped_steps']:>5}/{r['steps']}")  # fmt: skip
    return dict(
        device=torch.cuda.get_device_name(),
        label=args.label,
        parallel_from=args.parallel_from,
        compile_ms=compile_ms,
        rows=rows,
    )


if __name__ == "__main__":
    main()
