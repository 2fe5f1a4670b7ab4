"""Qwen3.5 / Qwen3-Next (Gated DeltaNet hybrids) in the native engine on a GPU, dummy bf16 weights with the
published shapes. Prints one table; the runner keeps the result.

  python -m benchmarks run qwen3_next -- --model qwen3.5-35b-a3b [--skip-hf]
  ... --model qwen3-next-80b-a3b --layers 24   (48 layers do not fit one H200 in bf16: fewer, said so)

- End to end (prompt 512, 128 new, greedy): B=1 and B=64 tok/s; transformers at B=1 in the same run
  (32 new tokens: its DeltaNet runs the torch fallback, flash-linear-attention being absent).
- The decode step (engine.step(), host work included) and its forward alone against the floor: the bytes a
  step must move (harness/floors.py: weights the batch touches, B=1 the top-k experts, B=64 the experts B*k
  uniform picks reach on average; the full-attention KV; every DeltaNet layer's recurrent and conv state
  read and written) over the copy bandwidth measured in the same run. B=1's weight part alone is the
  active-weight roofline.
- Prefill throughput of one 8k and one 32k prompt (chunks of max_num_batched_tokens, 8192).
Routers are re-drawn (dummy ones send every token to the same experts), so B=64 touches nearly all experts.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import tempfile
import time

import torch
import transformers

from atom_core.engine import LLM, SamplingParams
from benchmarks.harness.ceilings import copy_bandwidth
from benchmarks.harness.engine_timing import PROMPT, step_ms, tok_s
from benchmarks.harness.floors import cache_bytes, weight_bytes
from benchmarks.harness.routers import redraw_routers
from benchmarks.harness.shapes import SHAPES, make_config

HF_NEW = 32


def prompts(vocab: int, batch: int, length: int) -> list[dict]:
    return [{"prompt_token_ids": torch.randint(0, vocab, (length,)).tolist()} for _ in range(batch)]


def prefill_tok_s(llm: LLM, vocab: int, length: int) -> float:
    one = SamplingParams(temperature=0, max_tokens=1, ignore_eos=True)
    llm.generate(prompts(vocab, 1, length), one)  # compiles the chunk shapes
    work = prompts(vocab, 1, length)
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(work, one)
    torch.cuda.synchronize()
    return length / (time.perf_counter() - start)


def hf_tok_s(config) -> float:
    with torch.device("cuda"):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    redraw_routers(model.named_parameters(), config.hidden_size)
    ids = torch.randint(0, config.vocab_size, (1, PROMPT), device="cuda")
    model.generate(ids[:, :8], max_new_tokens=4, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=HF_NEW, min_new_tokens=HF_NEW, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    del model
    gc.collect()
    torch.cuda.empty_cache()
    return HF_NEW / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", choices=sorted(SHAPES), default="qwen3.5-35b-a3b")
    parser.add_argument("--layers", type=int, default=None, help="fewer layers than published (said so)")
    parser.add_argument("--skip-hf", action="store_true")
    args = parser.parse_args()
    config = make_config(args.model, args.layers)
    c = config
    bandwidth = copy_bandwidth()
    result = {
        "date": datetime.date.today().isoformat(),
        "device": torch.cuda.get_device_name(),
        "model": args.model,
        "layers": c.num_hidden_layers,
        "copy_bandwidth_TBps": bandwidth / 1e12,
    }
    rows = []
    hf = None if args.skip_hf else hf_tok_s(config)
    engine = dict(
        load_format="dummy", max_model_len=32768 + 64, max_num_seqs=64, num_kv_blocks=4200, dtype="bfloat16"
    )
    with tempfile.TemporaryDirectory() as path:
        config.save_pretrained(path)
        llm = LLM(path, **engine)
        redraw_routers(llm.engine.runner.model.named_parameters(), c.hidden_size)
        model = llm.engine.runner.model
        active = weight_bytes(model, 1)
        result["active_weight_GB"] = active / 1e9
        for batch in (1, 64):
            e2e = tok_s(llm, c.vocab_size, batch)
            whole, forward = step_ms(llm, c.vocab_size, batch)
            floor_bytes = weight_bytes(model, batch) + cache_bytes(model, batch, PROMPT + 64, torch.bfloat16)
            floor = floor_bytes / bandwidth * 1e3
            entry = dict(
                tok_s=e2e, step_ms=whole, forward_ms=forward, floor_ms=floor, step_over_floor=whole / floor
            )
            if batch == 1:
                roofline = bandwidth / active
                entry.update(active_roofline_tok_s=roofline, pct_active_roofline=100 * e2e / roofline)
            result[f"B{batch}"] = entry
            rows.append(
                (
                    f"B={batch}",
                    f"{e2e:,.0f} tok/s"
                    + (f" ({entry['pct_active_roofline']:.0f}% of {roofline:,.0f})" if batch == 1 else ""),
                    f"step {whole:.2f} ms (forward {forward:.2f})",
                    f"floor {floor:.2f} ms: {whole / floor:.2f}x",
                )
            )
        if hf is not None:
            result["hf_B1_tok_s"] = hf
            rows.append(
                ("transformers B=1", f"{hf:,.1f} tok/s", f"ATOM {result['B1']['tok_s'] / hf:.1f}x", "")
            )
        for length in (8192, 32768):
            rate = prefill_tok_s(llm, c.vocab_size, length)
            result[f"prefill_{length}_tok_s"] = rate
            rows.append(
                (f"prefill {length // 1024}k", f"{rate:,.0f} tok/s", f"{length / rate * 1e3:.0f} ms", "")
            )
        llm.engine.shutdown()
    width = [max(len(r[i]) for r in rows) for i in range(4)]
    print(
        f"{args.model} shape, {c.num_hidden_layers} layers, {result['device']}, copy {bandwidth / 1e12:.2f} TB/s, "
        f"active weights {active / 1e9:.2f} GB"
    )
    for r in rows:
        print("  ".join(col.ljust(w) for col, w in zip(r, width, strict=True)))
    return result


if __name__ == "__main__":
    main()
