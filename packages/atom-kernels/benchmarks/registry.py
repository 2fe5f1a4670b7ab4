"""atom-kernels' benchmarks: name -> script, with the targets their results answer.

Goals are the issues' (numbered); figures live in the ledgers under results/, PERFORMANCE.md shows them.
"""

from tools.bench_ledger import Bench, Target

_LLAMA = ("qkv", "o", "gate_up", "down")
_FP8_SKINNY = tuple(
    Target(
        f"fp8 skinny GEMM, Llama-3-8B {name}, {rows} rows, % of copy",
        f"rows[name=llama3-8b/{name},rows={rows}].fp8_pct_copy",
        80,
        "%",
        issue=53,
    )
    for name in _LLAMA
    for rows in (1, 16)
)


def _decode(shape: str, layout: str = "flash", kv: str = "bf16") -> str:
    return f"rows[op=decode,shape={shape},layout={layout},kv={kv}].roofline_pct"


BENCHES: dict[str, Bench] = {
    "paged_attention": Bench(
        "bench_paged_attention",
        "KV writes, paged decode (split-KV, persistent) and causal prefill against torch SDPA; `-- --only "
        "long` times the long-context rows.",
        (
            Target("paged decode B=64 L=8k bf16, % of copy", _decode("B=64 L=8192 page=16"), 95, "%"),
            Target(
                "paged decode B=1 L=32k bf16, % of copy", _decode("B=1 L=32768 page=16"), 85, "%", issue=53
            ),
            Target(
                "paged decode B=1 L=64k bf16, % of copy", _decode("B=1 L=65536 page=16"), 90, "%", issue=53
            ),
        ),
    ),
    "mla": Bench(
        "bench_mla",
        "Absorbed MLA decode over the paged latent cache (bf16 and e4m3) against SDPA on contiguous rows.",
        (
            Target(
                "MLA decode Hq=128 B=64 L=4k", "rows[case=decode Hq=128].tflops", 450, "TFLOP/s", issue=53
            ),
            Target("MLA decode Hq=16, % of copy", "rows[case=decode Hq=16].pct_copy", 85, "%", issue=53),
            Target(
                "MLA decode Hq=16, e4m3 latent speed / bf16",
                "rows[case=decode Hq=16].ms / rows[case=decode Hq=16 fp8].ms",
                1.5,
                "x",
                issue=53,
            ),
        ),
    ),
    "gdn": Bench(
        "bench_gdn",
        "GDN recurrent decode (bandwidth) and chunked prefill against flash-linear-attention in the same run.",
        (
            Target(
                "GDN chunked prefill T=8k, GPU time / FLA's",
                "rows[case=chunked prefill T=8192 H=32 D=128].gpu_over_fla_gpu",
                0.8,
                "x",
                higher_is_better=False,
                issue=53,
            ),
            Target(
                "GDN chunked prefill T=32k, GPU time / FLA's",
                "rows[case=chunked prefill T=32768 H=32 D=128].gpu_over_fla_gpu",
                0.8,
                "x",
                higher_is_better=False,
                issue=53,
            ),
            Target(
                "GDN decode B=64, % of copy",
                "rows[case=decode B=64 HV=32 D=128 fp32 state].pct_copy",
                90,
                "%",
                issue=53,
            ),
            *(
                Target(
                    f"GDN decode B={batch}, speed over FLA's fused_recurrent (graph replays)",
                    f"rows[case=decode B={batch} HV=32 D=128 fp32 state].x_fla",
                    2.0,
                    "x",
                    issue=53,
                )
                for batch in (1, 8)
            ),
        ),
    ),
    "fp8_linear": Bench(
        "bench_fp8_linear",
        "fp8_linear (e4m3 block weights) against bf16 cuBLAS at 1 to 16k rows.",
        _FP8_SKINNY,
    ),
    "linear": Bench(
        "bench_linear",
        "linear at decode's 1-16 rows on Llama-3-8B's projections against cuBLAS, and the host cost a call.",
        tuple(
            Target(
                f"bf16 GEMV, Llama-3-8B {name}, 1 row, % of copy",
                f"rows[name={name},rows=1].atom_pct_copy",
                80,
                "%",
            )
            for name in _LLAMA
        ),
    ),
    "moe": Bench("bench_moe", "Fused MoE experts and routing kernels against a per-expert torch loop."),
    "moe_fp8": Bench("bench_moe_fp8", "Fused MoE with e4m3 block experts against its bf16 path, same data."),
    "moe_mxfp4": Bench(
        "bench_moe_mxfp4",
        "Fused MoE with MXFP4 experts (GPT-OSS's shapes, biases, clamped SwiGLU) against bf16, same data.",
        tuple(
            Target(
                f"MXFP4 experts, {shape}, T={t}, % of copy",
                f"rows[shape={shape},tokens={t}].mxfp4_pct_copy",
                75,
                "%",
                issue=54,
            )
            for shape in ("gpt-oss-20b", "gpt-oss-120b")
            for t in (1, 8, 64)
        )
        + tuple(
            Target(
                f"MXFP4 experts, gpt-oss-120b, T={t}, speed over bf16 experts",
                f"rows[shape=gpt-oss-120b,tokens={t}].speedup",
                1.0,
                "x",
                issue=54,
            )
            for t in (1, 2, 4, 8, 16, 32, 64)
        ),
    ),
    "compile_moe_mxfp4_sm90": Bench(
        "compile_moe_mxfp4_sm90",
        "The MXFP4 expert GEMMs compiled for sm90 offline: registers, spills, MMA kind per tile shape.",
        gpus=0,
    ),
    "moe_combine": Bench("bench_moe_combine", "The MoE combine against torch's sum over [T, k, H]."),
    "moe_order": Bench(
        "bench_moe_order", "Token-by-expert ordering: one program against the multi-launch path."
    ),
    "elementwise": Bench(
        "bench_elementwise", "RMSNorm (+residual, gated), SiLU-and-mul, RoPE, MRoPE at T=16k."
    ),
    "qk_prologue": Bench("bench_qk_prologue", "The fused q/k norm + rotary + KV write at Qwen3.5's shape."),
    "greedy": Bench("bench_greedy", "greedy_tokens against torch's argmax and finiteness check."),
    "keyed_draw": Bench("bench_keyed_draw", "keyed_draw against the sort-based torch draw, 1-256 rows."),
    "pdl_chain": Bench("bench_pdl_chain", "What programmatic dependent launch does for a chain of GEMVs."),
    "all_reduce": Bench(
        "bench_all_reduce",
        "One-shot all-reduce (and its fused residual + RMSNorm) against NCCL; run under torchrun, one "
        "process a GPU.",
        gpus=2,
    ),
    "compile_decode_sm90": Bench(
        "compile_decode_sm90", "The decode kernels' sm_90 instruction mix, compiled without a GPU.", gpus=0
    ),
    "compile_mla_sm90": Bench(
        "compile_mla_sm90",
        "The MLA kernels' sm_90 registers, spills and MMAs, compiled without a GPU.",
        gpus=0,
    ),
    "profile_decode": Bench("profile_decode", "One decode launch, for Nsight Compute."),
    "profile_kv_write": Bench("profile_kv_write", "One KV-cache write, for Nsight Compute."),
    "sweep_decode_long": Bench("sweep_decode_long", "Split counts x tiles for long-context decode."),
    "sweep_decode_plan": Bench("sweep_decode_plan", "The short-walk decode plan against the generic one."),
    "sweep_fp8_linear": Bench(
        "sweep_fp8_linear", "Tiles of fp8_linear's kernels (stream_tiles, gemm_tiles)."
    ),
    "sweep_fp8_skinny": Bench("sweep_fp8_skinny", "The W8A8 skinny kernel's tiles at decode's few rows."),
    "sweep_gdn": Bench("sweep_gdn", "GDN chunked-prefill tiles (gdn_tiles)."),
    "sweep_gdn_decode": Bench("sweep_gdn_decode", "Tiles of the recurrent GDN decode kernel."),
    "sweep_kv_write": Bench("sweep_kv_write", "Tiles of the KV writes."),
    "sweep_moe_decode": Bench("sweep_moe_decode", "Expert-GEMM tiles for decode's few tokens (tile_config)."),
    "sweep_moe_mxfp4": Bench(
        "sweep_moe_mxfp4",
        "MXFP4 expert GEMVs (gemv_config) and tiles (mxfp4_tile_config) at gpt-oss-120b's shape.",
    ),
    "sweep_persistent": Bench("sweep_persistent", "Programs per SM of the persistent decode partition."),
    "sweep_rotary": Bench("sweep_rotary", "Tokens and warps per program of the rotary kernels."),
    "sweep_small_kernels": Bench("sweep_small_kernels", "Warps and tiles of a decode step's small kernels."),
    "sweep_tiles": Bench(
        "sweep_tiles", "Paged decode and prefill tile configurations (the launch defaults)."
    ),
}
