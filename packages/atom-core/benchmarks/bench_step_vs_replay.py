"""The engine's whole decode step, through the public LLM.generate, against the GPU time of its CUDA-graph
replay: how much of the host's work between steps is hidden.

  python -m benchmarks run step_vs_replay

Models at their published shapes with dummy bf16 weights (MoE routers re-drawn to realistic spreads):
Llama-3-8B, Qwen3-30B-A3B, Qwen3.5-35B-A3B and DeepSeek-V2-Lite with MTP k=2. For B=1 and B=64 and each
sampling (greedy; temperature 0.8 / top-p 0.95 / a seed per request), B fresh 512-token prompts generate
128 tokens through LLM.generate; a decode step is the median wall time of its LLMEngine.step calls in
the second half of the run (every sequence decoding; with async scheduling a call returns once the next
step is launched and the last one read, so calls follow the device's pace). The replay is the median,
over the same steps, of the GPU time of the graph replays each step launched (CUDA events around every
replay: the decode graph; with MTP, the verify graph, the draft's catch-up graph and its k - 1 chained
ones). ratio = step / replay: 1.00 when the host's work is wholly hidden.

isolated_replay_ms is the older measure, kept beside it: back-to-back replays of the last step's graphs
after the run. It re-runs one step's MoE routing, which at B=64 can touch fewer experts than the run's own
steps did, so it can read low against them.
"""

from __future__ import annotations

import argparse
import gc
import json
import tempfile
import time

import torch

from atom_core.engine import LLM, SamplingParams
from benchmarks.harness.routers import redraw_llm_routers
from benchmarks.harness.shapes import configs

PROMPT, NEW = 512, 128


def graph_sets(runner):
    """(decode, verify, [draft graphs]) whatever the engine's version names them."""
    graphs = runner.graphs
    if hasattr(graphs, "decode"):
        return graphs.decode, graphs.verify, graphs.drafts
    return graphs, getattr(runner, "verify_graphs", None), getattr(runner, "draft_graphs", [])


class TimedGraph:
    """A captured graph whose every replay is bracketed by CUDA events (read after the run)."""

    def __init__(self, graph, log: list):
        self.graph, self.log = graph, log

    def replay(self) -> None:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.graph.replay()
        end.record()
        self.log.append((start, end))

    def __getattr__(self, name):
        return getattr(self.graph, name)


def time_replays(runner, log: list) -> None:
    """Every captured graph of the runner logs its replays into log."""
    decode, verify, drafts = graph_sets(runner)
    for graphs in (decode, verify, *drafts):
        if graphs is not None:
            graphs.graphs = {size: TimedGraph(g, log) for size, g in graphs.graphs.items()}


def isolated_replay_ms(runner, batch: int, k: int) -> float:
    decode, verify, drafts = graph_sets(runner)
    replays = [decode] if k == 0 else [verify, drafts[1]] + [drafts[0]] * (k - 1)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        for g in replays:
            getattr(g.graphs[g.size_for(batch)], "graph", g.graphs[g.size_for(batch)]).replay()
    start.record()
    for _ in range(30):
        for g in replays:
            getattr(g.graphs[g.size_for(batch)], "graph", g.graphs[g.size_for(batch)]).replay()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 30


def decode_step_ms(
    llm: LLM, vocab: int, batch: int, params: SamplingParams, gen
) -> tuple[float, float, int, int]:
    """The median step of a steady decode through LLM.generate, the median GPU time of those steps' graph
    replays, how many steps the run took and how many of them overlapped the host."""
    prompts = [
        {"prompt_token_ids": torch.randint(0, vocab, (PROMPT,), generator=gen).tolist()} for _ in range(batch)
    ]
    engine = llm.engine
    engine.step_times, engine.step_replays = [], []
    engine.replay_log.clear()
    overlapped = _overlapped(llm)
    llm.generate(prompts, [params] * batch if params.seed is None else _seeded(params, batch))
    torch.cuda.synchronize()
    times = engine.step_times
    window = slice(len(times) // 2, len(times) - 3)
    steady = sorted(times[window])
    replays = sorted(  # (a step that replayed no graph, an eager one, has no replay to divide by)
        sum(start.elapsed_time(end) for start, end in engine.replay_log[a:b])
        for a, b in engine.step_replays[window]
        if b > a
    )
    return (
        steady[len(steady) // 2] * 1e3,
        replays[len(replays) // 2],
        len(times),
        _overlapped(llm) - overlapped,
    )


def _seeded(params: SamplingParams, batch: int) -> list[SamplingParams]:
    return [
        SamplingParams(
            temperature=params.temperature,
            top_p=params.top_p,
            seed=params.seed + i,
            max_tokens=params.max_tokens,
            ignore_eos=True,
        )
        for i in range(batch)
    ]


def time_steps(llm: LLM) -> None:
    engine, step = llm.engine, llm.engine.step

    def timed():
        first = len(engine.replay_log)
        start = time.perf_counter()
        out = step()
        engine.step_times.append(time.perf_counter() - start)
        engine.step_replays.append((first, len(engine.replay_log)))
        return out

    engine.step_times, engine.step_replays, engine.replay_log = [], [], []
    time_replays(engine.runner, engine.replay_log)
    engine.step = timed


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="llama3-8b,qwen3-30b-a3b,qwen3.5-35b-a3b,deepseek-v2-lite-mtp2")
    parser.add_argument("--batches", default="1,64")
    parser.add_argument("--label", default="", help="which tree ran (kept in the record)")
    args = parser.parse_args()
    rows = []
    for name in args.models.split(","):
        config, extra = configs(name)
        with tempfile.TemporaryDirectory() as d:
            config.save_pretrained(d)
            llm = LLM(d, load_format="dummy", dtype="bfloat16", max_model_len=1024, max_num_seqs=64, **extra)
            redraw_llm_routers(llm, config.hidden_size)
            time_steps(llm)
            k = extra.get("speculative_config", {}).get("num_speculative_tokens", 0)
            gen = torch.Generator().manual_seed(0)
            for batch in (int(b) for b in args.batches.split(",")):
                for sampling, base in (
                    ("greedy", dict(temperature=0.0)),
                    ("t0.8/p0.95/seed", dict(temperature=0.8, top_p=0.95, seed=1000)),
                ):
                    full = SamplingParams(**base, max_tokens=NEW, ignore_eos=True)
                    decode_step_ms(llm, config.vocab_size, batch, full, gen)  # warm-up
                    step, replay, steps, overlapped = decode_step_ms(llm, config.vocab_size, batch, full, gen)
                    isolated = isolated_replay_ms(llm.engine.runner, batch, k)
                    row = dict(
                        model=name,
                        batch=batch,
                        sampling=sampling,
                        step_ms=step,
                        replay_ms=replay,
                        ratio=step / replay,
                        isolated_replay_ms=isolated,
                        steps=steps,
                        overlapped_steps=overlapped,  # (of this run's steps)
                    )
                    rows.append(row)
                    print(json.dumps(row), flush=True)
            llm.shutdown()
            del llm
            gc.collect()
            torch.cuda.empty_cache()
    print(f"\n{torch.cuda.get_device_name()}  {args.label}")
    print(f"{'model':<24}{'B':>4} {'sampling':<16}{'step ms':>9}{'replay ms':>10}{'ratio':>7}{'isolated':>9}")
    for r in rows:
        print(
            f"{r['model']:<24}{r['batch']:>4} {r['sampling']:<16}{r['step_ms']:>9.3f}{r['replay_ms']:>10.3f}"
            f"{r['ratio']:>7.3f}{r['isolated_replay_ms']:>9.3f}"
        )
    return dict(device=torch.cuda.get_device_name(), label=args.label, prompt=PROMPT, new=NEW, rows=rows)


def _overlapped(llm: LLM) -> int:
    """Steps launched so far while the one before was in flight (the engine counts them cumulatively)."""
    return llm.engine.stats.num_async_steps


if __name__ == "__main__":
    main()
