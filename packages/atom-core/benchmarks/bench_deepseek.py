"""DeepSeek in the native engine on a GPU (dummy bf16 weights): a DeepSeek-V2-Lite-shaped DeepseekV3 with one
MTP layer. Prints one table; the runner keeps the result in the ledger.

  python -m benchmarks run deepseek -- [--layers 27] [--skip-hf] [--ks 1 2 3]

- End to end (prompt 512, 128 new, greedy): B=1 and B=64 tok/s; transformers at B=1 in the same run.
- The decode step alone (engine.step(), host work included) against its floor: the bytes a step must read
  (harness/floors.py: attention, dense and shared layers, the experts B*k uniform picks reach, the head,
  the latent cache) over the copy bandwidth measured in the same run. The routers are re-drawn (realistic_routers:
  dummy ones send every token to the same experts), so B=64 touches nearly every expert, as the floor assumes.
- MTP speculative decoding, k = 1..3: the verify forward alone (k + 1 tokens a sequence, CUDA graph) against
  a plain decode forward, the whole speculative step (verify + draft + host), and end to end at B=1 with the
  draft's acceptance forced to 100% (the final norms of target and draft zeroed: every logit is 0, both
  pick token 0; the same kernels read the same bytes), beside the speed-up that the measured step costs
  give at 80% acceptance per drafted token; and end to end at B=1 with each drafted token right with
  probability 0.7, independently (an oracle forces the drafts on the device), beside the speed-up the
  measured step costs predict at that rate.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import tempfile
import time

import torch
from transformers import AutoModelForCausalLM, DeepseekV3Config

from atom_core.engine import LLM
from benchmarks.harness.ceilings import copy_bandwidth
from benchmarks.harness.engine_timing import NEW, PROMPT, step_ms, tok_s
from benchmarks.harness.floors import cache_bytes, weight_bytes
from benchmarks.harness.routers import redraw_llm_routers
from benchmarks.harness.shapes import v2_lite_shape


def hf_tok_s(config: DeepseekV3Config) -> float:
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    ids = torch.randint(0, config.vocab_size, (1, PROMPT), device="cuda")
    model.generate(ids[:, :8], max_new_tokens=4, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    start = time.perf_counter()
    model.generate(ids, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)
    torch.cuda.synchronize()
    del model
    torch.cuda.empty_cache()
    return NEW / (time.perf_counter() - start)


def force_full_acceptance(llm: LLM) -> None:
    runner = llm.engine.runner
    runner.model.model.norm.weight.data.zero_()
    runner.draft.block.shared_head.norm.weight.data.zero_()


ORACLE_RATE = 0.7


def forced_rate_run(llm: LLM, vocab: int, k: int, rate: float) -> dict:
    """B=1 end to end with each drafted token right with probability `rate`, independently (the target
    picks token 0 once force_full_acceptance zeroed its norm; the oracle proposes 0, else 1, from a hash
    of the draft's output position and index), on the device, so verifies still launch ahead. Returns
    tok/s, the tokens a verify step emitted on average, accepted/drafted, and the expected tokens a step,
    (1 - rate^(k+1)) / (1 - rate)."""
    drafter, stats = llm.engine.drafter, llm.engine.stats

    def ahead(seqs, j, positions, tokens):
        x = positions.to(torch.int64) * 0x9E3779B1 + (j + 1) * 0x85EBCA77  # a mixed (position, j) key
        for _ in range(2):
            x = (x ^ (x >> 15)) * 0x2C1B3C6D
        u = (x & 0xFFFFFF).double() / float(1 << 24)
        return torch.where(u < rate, 0, 1).to(torch.int64)

    drafter.ahead_oracle = ahead
    before = (stats.num_draft_tokens, stats.num_accepted_tokens, stats.num_verifications)
    try:
        rate_e2e = tok_s(llm, vocab, 1)
    finally:
        drafter.ahead_oracle = None
    drafted = stats.num_draft_tokens - before[0]
    accepted = stats.num_accepted_tokens - before[1]
    verifies = max(stats.num_verifications - before[2], 1)
    return dict(
        rate=rate,
        tok_s=rate_e2e,
        tokens_per_step=(accepted + verifies) / verifies,
        accepted_over_drafted=accepted / max(drafted, 1),
        expected_tokens_per_step=(1 - rate ** (k + 1)) / (1 - rate),
    )


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--layers", type=int, default=27)
    parser.add_argument("--skip-hf", action="store_true")
    parser.add_argument("--ks", type=int, nargs="+", default=[1, 2, 3], help="MTP draft lengths to run")
    args = parser.parse_args()
    config = v2_lite_shape(args.layers)
    bandwidth = copy_bandwidth()
    rows, result = [], {"date": datetime.date.today().isoformat(), "device": torch.cuda.get_device_name()}
    result["copy_bandwidth_TBps"] = bandwidth / 1e12
    # enough KV blocks for 64 sequences (and a step's drafts), not a share of memory: engines come and go
    common = dict(load_format="dummy", max_model_len=PROMPT + NEW + 16, max_num_seqs=64, num_kv_blocks=3200)
    with tempfile.TemporaryDirectory() as path:
        config.save_pretrained(path)
        vocab = config.vocab_size
        hf = None if args.skip_hf else hf_tok_s(config)
        llm = LLM(path, **common)
        redraw_llm_routers(llm, config.hidden_size)
        for batch in (1, 64):
            e2e = tok_s(llm, vocab, batch)
            whole, forward = step_ms(llm, vocab, batch)
            model = llm.engine.runner.model  # the target alone: the MTP layer is not part of a plain step
            floor_bytes = weight_bytes(model, batch) + cache_bytes(model, batch, PROMPT + 64, torch.bfloat16)
            floor = floor_bytes / bandwidth * 1e3
            result[f"plain_B{batch}"] = dict(
                tok_s=e2e, step_ms=whole, forward_ms=forward, floor_ms=floor, step_over_floor=whole / floor
            )
            rows.append(
                (
                    f"plain B={batch}",
                    f"{e2e:,.0f} tok/s",
                    f"step {whole:.2f} ms (forward {forward:.2f})",
                    f"floor {floor:.2f} ms: {whole / floor:.2f}x ({floor / whole:.0%} of roofline)",
                )
            )
        if hf is not None:
            result["hf_B1_tok_s"] = hf
            rows.append(
                ("transformers B=1", f"{hf:,.1f} tok/s", f"ATOM {result['plain_B1']['tok_s'] / hf:.1f}x", "")
            )
        plain_forward = {b: result[f"plain_B{b}"]["forward_ms"] for b in (1, 64)}
        plain_step = {b: result[f"plain_B{b}"]["step_ms"] for b in (1, 64)}
        llm.engine.shutdown()
        del llm
        gc.collect()
        torch.cuda.empty_cache()
        for k in args.ks:
            llm = LLM(path, **common, speculative_config={"method": "mtp", "num_speculative_tokens": k})
            redraw_llm_routers(llm, config.hidden_size)
            entry = {}
            for batch in (1, 64):
                whole, forward = step_ms(llm, vocab, batch)
                ratio = forward / plain_forward[batch]
                tokens_08 = sum(
                    0.8**i for i in range(k + 1)
                )  # expected tokens a step emits at 80% acceptance
                entry[f"B{batch}"] = dict(
                    verify_forward_ms=forward,
                    verify_over_decode=ratio,
                    spec_step_ms=whole,
                    projected_speedup_at_0_8=tokens_08 * plain_step[batch] / whole,
                )
                rows.append(
                    (
                        f"MTP k={k} B={batch}",
                        f"verify {forward:.2f} ms = {ratio:.2f}x decode",
                        f"spec step {whole:.2f} ms",
                        f"at 80%: {tokens_08 * plain_step[batch] / whole:.2f}x",
                    )
                )
            force_full_acceptance(llm)
            stats = llm.engine.stats
            drafted, accepted = stats.num_draft_tokens, stats.num_accepted_tokens
            e2e = tok_s(llm, vocab, 1)
            entry["B1_full_acceptance_tok_s"] = e2e
            entry["B1_full_acceptance_speedup"] = e2e / result["plain_B1"]["tok_s"]
            entry["acceptance_rate"] = (stats.num_accepted_tokens - accepted) / max(
                stats.num_draft_tokens - drafted, 1
            )
            rows.append(
                (
                    f"MTP k={k} B=1 e2e",
                    f"{e2e:,.0f} tok/s",
                    f"{entry['B1_full_acceptance_speedup']:.2f}x plain",
                    f"acceptance {entry['acceptance_rate']:.0%} (forced)",
                )
            )
            entry["B1_forced"] = forced = forced_rate_run(llm, vocab, k, ORACLE_RATE)
            forced["speedup"] = forced["tok_s"] / result["plain_B1"]["tok_s"]
            # the speed-up the measured step costs predict at that acceptance: tokens a step emits, over
            # the speculative step's cost in plain steps
            forced["expected_speedup"] = (
                forced["expected_tokens_per_step"] * plain_step[1] / entry["B1"]["spec_step_ms"]
            )
            # the same at the tokens a step the oracle's draws gave (a few hundred draws stray from the rate)
            forced["expected_at_measured"] = (
                forced["tokens_per_step"] * plain_step[1] / entry["B1"]["spec_step_ms"]
            )
            rows.append(
                (
                    f"MTP k={k} B=1 e2e, {ORACLE_RATE:.0%} oracle",
                    f"{forced['tok_s']:,.0f} tok/s",
                    f"{forced['speedup']:.2f}x plain (expected {forced['expected_speedup']:.2f}x, "
                    f"{forced['expected_at_measured']:.2f}x at the tokens a step measured)",
                    f"{forced['tokens_per_step']:.2f} tokens a step, accepted/drafted "
                    f"{forced['accepted_over_drafted']:.0%}",
                )
            )
            result[f"mtp_k{k}"] = entry
            llm.engine.shutdown()
            del llm, stats
            gc.collect()
            torch.cuda.empty_cache()
    width = [max(len(r[i]) for r in rows) for i in range(4)]
    print(
        f"DeepSeek-V2-Lite shape ({args.layers} layers), {result['device']}, copy {bandwidth / 1e12:.2f} TB/s"
    )
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, width, strict=True)))
    return result


if __name__ == "__main__":
    main()
