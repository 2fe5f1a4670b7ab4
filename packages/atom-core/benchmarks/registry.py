"""atom-core's benchmarks: name -> script, with the targets their results answer.

Goals are the issues' (numbered); figures live in the ledgers under results/, PERFORMANCE.md shows them.
The engine benchmarks build published shapes with dummy weights and time the public LLM.generate path.
"""

from tools.bench_ledger import Bench, Target

_STEP_MODELS = ("llama3-8b", "qwen3-30b-a3b", "qwen3.5-35b-a3b", "deepseek-v2-lite-mtp2")
_STEP_TARGETS = tuple(
    Target(
        f"{model} B={batch} {sampling}: whole step / its graph replays",
        f"rows[model={model},batch={batch},sampling={sampling}].ratio",
        1.03,
        "x",
        higher_is_better=False,
        issue=47,
    )
    for model in _STEP_MODELS
    for batch in (1, 64)
    for sampling in ("greedy", "t0.8/p0.95/seed")
)

_B1_GOALS = (  # issue 52: B=1 decode, % of the active-weight roofline
    ("llama3-8b", 88),
    ("llama3-8b-fp8", 75),
    ("qwen3-30b-a3b", 70),
    ("deepseek-v2-lite", 70),
    ("qwen3.5-35b-a3b", 70),
)

BENCHES: dict[str, Bench] = {
    "decode": Bench(
        "bench_decode",
        "Issue 52's table: B=1 tok/s and % of the active-weight roofline, B=64 step / floor, every target model.",
        tuple(
            Target(
                f"{model} B=1 decode, % of the active-weight roofline",
                f"rows[model={model},batch=1].pct_active_roofline",
                goal,
                "%",
                issue=52,
            )
            for model, goal in _B1_GOALS
        )
        + tuple(
            Target(
                f"{model} B=64 step / floor",
                f"rows[model={model},batch=64].step_over_floor",
                1.25,
                "x",
                higher_is_better=False,
                issue=52,
            )
            for model, _ in _B1_GOALS
        ),
    ),
    "decode_gpt_oss": Bench(
        "bench_decode_gpt_oss",
        "Issue 54's rows: GPT-OSS 20b and 120b decode with MXFP4 experts, bench_decode's method.",
        tuple(  # the roofline counts the experts' MXFP4 bytes
            target
            for model in ("gpt-oss-20b", "gpt-oss-120b")
            for target in (
                Target(
                    f"{model} B=1 decode, % of the active-weight roofline",
                    f"rows[model={model},batch=1].pct_active_roofline",
                    65,
                    "%",
                    issue=54,
                ),
                Target(
                    f"{model} B=64 step / floor",
                    f"rows[model={model},batch=64].step_over_floor",
                    1.3,
                    "x",
                    higher_is_better=False,
                    issue=54,
                ),
            )
        ),
    ),
    "engine": Bench(
        "bench_engine",
        "Llama-3-8B shape: output tok/s at B=1 and B=64 against transformers, and % of the weight roofline.",
    ),
    "deepseek": Bench(
        "bench_deepseek",
        "DeepSeek-V2-Lite shape with its MTP layer: plain and MTP k=1-3 decode against the step's floor.",
        (
            Target(
                "DeepSeek-V2-Lite MTP k=3 B=1, full acceptance, speed / plain",
                "mtp_k3.B1_full_acceptance_speedup",
                2.8,
                "x",
                issue=52,
            ),
        ),
    ),
    "qwen3_next": Bench(
        "bench_qwen3_next",
        "Qwen3.5 / Qwen3-Next hybrids (`-- --model NAME`): B=1 and B=64 decode against the floor, prefill.",
    ),
    "ttft": Bench(
        "bench_ttft",
        "Time to first token, one request at a time: Qwen3.5-35B-A3B, DeepSeek-V2-Lite, Llama-3-8B shapes.",
        tuple(
            Target(
                f"{model} TTFT, {tokens}-token prompt",
                f"rows[model={model},tokens={tokens}].ttft_ms",
                goal,
                "ms",
                higher_is_better=False,
                issue=52,
            )
            for model, tokens, goal in (
                ("qwen3.5-35b-a3b", 16, 10),
                ("qwen3.5-35b-a3b", 512, 30),
                ("deepseek-v2-lite", 512, 22),
            )
        ),
    ),
    "step_vs_replay": Bench(
        "bench_step_vs_replay",
        "The whole decode step through LLM.generate against the GPU time of its graph replays.",
        _STEP_TARGETS,
    ),
    "structured_outputs": Bench(
        "bench_structured_outputs",
        "A decode step where every row is held to a JSON schema, against the same batch without one.",
        (
            Target(
                "structured step / plain step, B=1",
                "rows[batch=1,structured=True].step_ms / rows[batch=1,structured=False].step_ms",
                1.05,
                "x",
                higher_is_better=False,
                issue=50,
            ),
            Target(
                "structured step / plain step, B=64",
                "rows[batch=64,structured=True].step_ms / rows[batch=64,structured=False].step_ms",
                1.10,
                "x",
                higher_is_better=False,
                issue=50,
            ),
        ),
    ),
    "engine_shapes": Bench(
        "bench_engine_shapes",
        "B=256 with short prompts and B=4 at 32k context, async scheduling against synchronous steps.",
    ),
    "fp8_engine": Bench(
        "bench_fp8_engine", "FP8 block-quantized weights against bf16, same shapes, B=1 and B=64."
    ),
    "deepseek_v3_slice": Bench(
        "bench_deepseek_v3_slice", "A DeepSeek-V3-shaped 4-layer slice against its floor."
    ),
    "mla_prefill": Bench("bench_mla_prefill", "MLA fresh prefill: absorbed against un-absorbed attention."),
    "moe_order_engine": Bench(
        "bench_moe_order_engine", "Qwen3-30B-A3B decode, one-program expert ordering on/off."
    ),
    "arrivals": Bench(
        "bench_arrivals", "Requests arriving over time: throughput, latency, steps overlapping the host."
    ),
    "grammar_backends": Bench(
        "bench_grammar_backends", "xgrammar against llguidance: schema compile and mask fill (CPU).", gpus=0
    ),
    "routing_spread": Bench(
        "routing_spread",
        "Distinct tokens and experts a decode step of a dummy-weight GPT-OSS, biases kept or zeroed (CPU).",
        gpus=0,
    ),
    "count_launches": Bench(
        "count_launches",
        "What a hybrid prefill and decode step launch on a GPU (torch ops + Triton kernels), counted on the CPU.",
        gpus=0,
    ),
    "profile_engine_step": Bench(
        "profile_engine_step", "Where a decode step's time goes: replay, schedule, inputs, sample."
    ),
    "profile_spec_step": Bench(
        "profile_spec_step",
        "Where an MTP speculative step's time goes (V2-Lite shape, acceptance forced): GPU busy / wall, kernels.",
    ),
}
