"""The engine at a big batch and at long context, async scheduling against synchronous steps, on a GPU.

  python -m benchmarks run engine_shapes -- [--model llama3-8b qwen3-30b-a3b]

Rows (dummy bf16 weights, greedy): B=256 with 128-token prompts and 256 new tokens; B=4 with 32k-token
prompts and 128 new. For each: end-to-end output tok/s (prefill included), the prefill time (until every
request has its first token) and the decode step (the rest, per step), against the decode floor: the bytes
a step must read (weights, the experts B tokens touch under uniform routing, and the KV cache at the mean
context) over the copy bandwidth measured in the same run. MoE routers are redrawn as in bench_qwen3_next.py
(every engine the same): the dummy ones send most tokens to a few experts.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM

from atom_core.engine import LLM, LLMEngine, SamplingParams
from benchmarks.harness.ceilings import copy_bandwidth
from benchmarks.harness.routers import redraw_routers
from benchmarks.harness.shapes import llama3_8b, qwen3_30b_a3b

ROWS = ((256, 128, 256), (4, 32768, 128))  # (batch, prompt, new tokens)
MODELS = {"llama3-8b": lambda: llama3_8b(32), "qwen3-30b-a3b": qwen3_30b_a3b}


def step_floor_bytes(config, batch: int, context: float) -> float:
    """Bytes one decode step of `batch` sequences at `context` tokens must read (bf16)."""
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    total = sum(p.numel() for p in model.parameters())
    embed = config.vocab_size * config.hidden_size  # only B rows of it are read
    experts = getattr(config, "num_experts", 0)
    if experts:  # the expected number of distinct experts B tokens' top-k choices touch, per layer
        per_expert = 3 * config.hidden_size * config.moe_intermediate_size
        touched = experts * (1 - (1 - config.num_experts_per_tok / experts) ** batch)
        total -= config.num_hidden_layers * (experts - touched) * per_expert
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * context * batch
    return 2 * (total - embed + kv)


def run_row(engine: LLMEngine, vocab: int, batch: int, prompt: int, new: int) -> dict:
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)

    def add(n: int, length: int, p: SamplingParams) -> None:
        for _ in range(n):
            engine.add_request({"prompt_token_ids": torch.randint(0, vocab, (length,)).tolist()}, p)

    # warm-up on other prompts of the same shape: Triton's compiles for this row's prefill chunks and
    # decode batch must not land in the timed run
    add(batch, prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))
    while engine.has_unfinished_requests():
        engine.step()
    add(batch, prompt, params)
    torch.cuda.synchronize()
    start = time.perf_counter()
    first = None
    produced = 0
    while engine.has_unfinished_requests():
        outs = engine.step()
        if first is None and all(s.output_token_ids for r in engine.requests.values() for s in r.seqs):
            first = time.perf_counter()
        produced += sum(1 for o in outs if o.finished)
    torch.cuda.synchronize()
    end = time.perf_counter()
    first = first or end
    return dict(
        batch=batch,
        prompt=prompt,
        new_tokens=new,
        tok_s=batch * new / (end - start),
        prefill_s=first - start,
        decode_step_ms=(end - first) * 1000 / (new - 1),
        finished=produced,
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    args = parser.parse_args()
    copy_bw = copy_bandwidth()
    records = []
    for name in args.model:
        config = MODELS[name]()
        config.max_position_embeddings = max(p + n for _, p, n in ROWS) + 16
        with tempfile.TemporaryDirectory() as d:
            config.save_pretrained(d)
            for variant, asynchronous in (("async", True), ("sync", False)):
                llm = LLM(
                    d,
                    load_format="dummy",
                    dtype="bfloat16",
                    max_num_seqs=256,
                    max_num_batched_tokens=16384,
                    async_scheduling=asynchronous,
                )
                if getattr(config, "num_experts", 0):  # dummy routers would send most tokens to a few experts
                    redraw_routers(llm.engine.runner.model.named_parameters(), config.hidden_size)
                for batch, prompt, new in ROWS:
                    row = run_row(llm.engine, config.vocab_size, batch, prompt, new)
                    floor_ms = step_floor_bytes(config, batch, prompt + new / 2) / copy_bw * 1000
                    row.update(model=name, variant=variant, floor_step_ms=floor_ms)
                    row["step_over_floor"] = row["decode_step_ms"] / floor_ms
                    records.append(row)
                    print(row, flush=True)
                llm.shutdown()
                del llm
                torch.cuda.empty_cache()
    result = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        copy_tb_s=copy_bw / 1e12,
        rows=records,
    )
    print(f"\n{result['device']}  copy {copy_bw / 1e12:.2f} TB/s")
    print(
        f"{'model':>14} {'B':>4} {'prompt':>6} {'new':>4} {'variant':>7} {'tok/s':>9} {'prefill s':>9} "
        f"{'step ms':>8} {'floor ms':>8} {'x floor':>7}"
    )
    for r in records:
        print(
            f"{r['model']:>14} {r['batch']:>4} {r['prompt']:>6} {r['new_tokens']:>4} {r['variant']:>7} "
            f"{r['tok_s']:>9.1f} {r['prefill_s']:>9.2f} {r['decode_step_ms']:>8.2f} {r['floor_step_ms']:>8.2f} "
            f"{r['step_over_floor']:>7.2f}"
        )
    return result


if __name__ == "__main__":
    main()
