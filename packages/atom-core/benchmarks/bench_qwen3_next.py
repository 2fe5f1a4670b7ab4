"""Qwen3.5 / Qwen3-Next (Gated DeltaNet hybrids) in the native engine on a GPU, dummy bf16 weights with the
published shapes. Prints one table; the runner keeps the result.

  python -m benchmarks run qwen3_next -- --model qwen3.5-35b-a3b [--skip-hf]
  ... --model qwen3-next-80b-a3b --layers 24   (48 layers do not fit one H200 in bf16: fewer, said so)

- End to end (prompt 512, 128 new, greedy): B=1 and B=64 tok/s; transformers at B=1 in the same run
  (32 new tokens: its DeltaNet runs the torch fallback, flash-linear-attention being absent).
- The decode step (engine.step(), host work included) and its forward alone against the floor: the bytes a
  step must move (weights the batch touches: B=1 the top-k experts, B=64 the experts B*k uniform picks
  reach on average, E(1 - (1 - 1/E)^(Bk)); the full-attention KV; every DeltaNet layer's recurrent state
  read and written, conv state too) over the copy bandwidth measured in the same run. B=1's weight part
  alone is the active-weight roofline.
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
from benchmarks.harness.routers import redraw_routers
from benchmarks.harness.shapes import SHAPES, make_config

HF_NEW = 32


def weight_bytes(c, experts_touched: float) -> float:
    """bf16 weight bytes one decode step reads."""
    h, hd = c.hidden_size, c.head_dim
    full = c.layer_types.count("full_attention")
    linear = c.num_hidden_layers - full
    attention = h * 2 * c.num_attention_heads * hd + 2 * h * c.num_key_value_heads * hd
    attention += c.num_attention_heads * hd * h
    key, value = (
        c.linear_num_key_heads * c.linear_key_head_dim,
        c.linear_num_value_heads * c.linear_value_head_dim,
    )
    conv = 2 * key + value
    gdn = h * (conv + value + 2 * c.linear_num_value_heads) + value * h + conv * c.linear_conv_kernel_dim
    moe = c.num_experts * h + 3 * h * c.shared_expert_intermediate_size + h
    moe += experts_touched * 3 * h * c.moe_intermediate_size
    return 2 * (full * attention + linear * gdn + c.num_hidden_layers * moe + c.vocab_size * h)


def cache_bytes(c, batch: int, length: int) -> int:
    """KV of the full-attention layers read, DeltaNet states read and written, for one decode step."""
    full = c.layer_types.count("full_attention")
    linear = c.num_hidden_layers - full
    kv = full * batch * length * 2 * c.num_key_value_heads * c.head_dim * 2
    recurrent = c.linear_num_value_heads * c.linear_value_head_dim * c.linear_key_head_dim * 4
    conv_dim = (
        2 * c.linear_num_key_heads * c.linear_key_head_dim
        + c.linear_num_value_heads * c.linear_value_head_dim
    )
    conv = conv_dim * (c.linear_conv_kernel_dim - 1) * 2
    return kv + linear * batch * 2 * (recurrent + conv)


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
        active = weight_bytes(c, c.num_experts_per_tok)
        result["active_weight_GB"] = active / 1e9
        for batch in (1, 64):
            e2e = tok_s(llm, c.vocab_size, batch)
            whole, forward = step_ms(llm, c.vocab_size, batch)
            picks = batch * c.num_experts_per_tok
            touched = (
                c.num_experts_per_tok
                if batch == 1
                else c.num_experts * (1 - (1 - 1 / c.num_experts) ** picks)
            )
            floor_bytes = weight_bytes(c, touched) + cache_bytes(c, batch, PROMPT + 64)
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
