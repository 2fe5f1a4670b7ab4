"""Engine throughput on a Llama-3-8B-shaped model (dummy bf16 weights), beside HF transformers, on a GPU.

  python -m benchmarks run engine -- [--layers 32]

B=1 and B=64, prompt 512, 128 new tokens, greedy. Roofline: each decode step reads every weight once.
Ablations in the same run: synchronous steps (--no-async-scheduling: the host's work between steps not
overlapped with the GPU's) and eager (no CUDA graphs).
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, LlamaConfig

from atom_core.engine import LLM, SamplingParams
from benchmarks.harness.ceilings import copy_bandwidth
from benchmarks.harness.shapes import llama3_8b


def hf_tok_s(config: LlamaConfig, batch: int, prompt: int, new: int) -> float:
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (batch, prompt), device="cuda")
    kw = dict(max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)
    model.generate(ids[:, :8], max_new_tokens=4, do_sample=False, pad_token_id=0)  # warm up
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    torch.cuda.synchronize()
    elapsed = time.perf_counter() - start
    del model
    torch.cuda.empty_cache()
    return batch * new / elapsed


def atom_tok_s(llm: LLM, vocab: int, batch: int, prompt: int, new: int) -> float:
    params = SamplingParams(temperature=0, max_tokens=new, ignore_eos=True)

    def fresh():
        return [{"prompt_token_ids": torch.randint(0, vocab, (prompt,)).tolist()} for _ in range(batch)]

    # Warm up on other prompts of the same shape: Triton compiles a kernel per argument specialization
    # (a batch of 1 is one), which must not land in the timed run, and a repeated prompt would be a
    # prefix-cache hit there.
    llm.generate(fresh(), SamplingParams(temperature=0, max_tokens=2, ignore_eos=True))
    prompts = fresh()
    torch.cuda.synchronize()
    start = time.perf_counter()
    llm.generate(prompts, params)
    torch.cuda.synchronize()
    return batch * new / (time.perf_counter() - start)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument("--skip-hf", action="store_true", help="no transformers baseline (e.g. for TP runs)")
    parser.add_argument("--skip-eager", action="store_true", help="no eager-engine ablation")
    parser.add_argument(
        "--disable-custom-all-reduce", action="store_true", help="TP: NCCL for every all-reduce"
    )
    args = parser.parse_args()
    config = llama3_8b(args.layers)
    prompt, new = 512, 128
    with torch.device("meta"):  # count parameters without allocating them
        weight_bytes = sum(p.numel() for p in AutoModelForCausalLM.from_config(config).parameters()) * 2
    copy_bw = copy_bandwidth()  # measured once a process: the runner's record reuses it
    roofline_b1 = copy_bw / weight_bytes  # decode steps per second if weights are read once per step
    rows = []
    with tempfile.TemporaryDirectory() as d:
        config.save_pretrained(d)
        atom = {}
        # CUDA graphs and async scheduling (the defaults), then the ablations
        variants = {"graphs": {}, "sync": dict(async_scheduling=False), "eager": dict(enforce_eager=True)}
        if args.skip_eager:
            del variants["eager"]
        for name, variant in variants.items():
            start = time.perf_counter()
            llm = LLM(
                d,
                load_format="dummy",
                dtype="bfloat16",
                max_model_len=prompt + new + 16,
                max_num_seqs=64,
                tensor_parallel_size=args.tensor_parallel_size,
                disable_custom_all_reduce=args.disable_custom_all_reduce,
                **variant,
            )
            startup = time.perf_counter() - start
            atom[name] = {b: atom_tok_s(llm, config.vocab_size, b, prompt, new) for b in (1, 64)}
            print(f"ATOM {name}: start {startup:.1f} s, {atom[name]}", flush=True)
            llm.shutdown()
            del llm
            torch.cuda.empty_cache()
    hf = {b: None if args.skip_hf else hf_tok_s(config, b, prompt, new) for b in (1, 64)}
    roofline_b1 *= args.tensor_parallel_size  # each rank reads its shard of the weights (all-reduces ignored)
    for b in (1, 64):
        graphs, eager = atom["graphs"][b], atom["eager"][b] if "eager" in atom else None
        rows.append(
            dict(
                batch=b,
                prompt=prompt,
                new_tokens=new,
                atom_tok_s=graphs,
                atom_sync_tok_s=atom["sync"][b],
                atom_eager_tok_s=eager,
                hf_tok_s=hf[b],
                x_hf=graphs / hf[b] if hf[b] else None,
                roofline_tok_s=roofline_b1 * b,
                pct_roofline=100 * graphs / (roofline_b1 * b),
            )
        )
    record = dict(
        device=torch.cuda.get_device_name(),
        date=datetime.date.today().isoformat(),
        layers=args.layers,
        tensor_parallel_size=args.tensor_parallel_size,
        custom_all_reduce=args.tensor_parallel_size > 1 and not args.disable_custom_all_reduce,
        weight_gb=weight_bytes / 1e9,
        copy_tb_s=copy_bw / 1e12,
        cuda_graphs=True,
        async_scheduling=True,
        rows=rows,
    )
    print(
        f"\n{record['device']} x TP {args.tensor_parallel_size}  weights {record['weight_gb']:.1f} GB  "
        f"copy {record['copy_tb_s']:.2f} TB/s per GPU"
    )
    print(
        f"{'B':>4} {'ATOM tok/s':>12} {'sync':>8} {'eager':>8} {'HF tok/s':>10} {'x HF':>7} {'roofline':>10} "
        f"{'% roof':>7}"
    )
    for r in rows:
        hf_s = f"{r['hf_tok_s']:>10.1f} {r['x_hf']:>7.2f}" if r["hf_tok_s"] else f"{'-':>10} {'-':>7}"
        print(
            f"{r['batch']:>4} {r['atom_tok_s']:>12.1f} {r['atom_sync_tok_s']:>8.1f} "
            f"{r['atom_eager_tok_s'] or float('nan'):>8.1f} {hf_s} "
            f"{r['roofline_tok_s']:>10.1f} {r['pct_roofline']:>6.1f}%"
        )
    return record


if __name__ == "__main__":
    main()
