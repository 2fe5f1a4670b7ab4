"""MLA fresh prefill on a GPU: absorbed (latent cache, 576 per head and row) against un-absorbed (K/V
up-projected once, dense causal attention over nope + rope), through DeepSeek-V3's attention layer with dummy
bf16 weights; the varlen kernel against torch SDPA on the same up-projected q/k/v. Sets
UNABSORBED_MIN_TOKENS (attention/mla.py). Prints a table; the runner keeps the result.

  python -m benchmarks run mla_prefill

Per case (one sequence of T new tokens, or 8 of T/8): the whole layer forward (projections included) both
ways, CUDA-event timed medians; the attention alone in TFLOP/s (causal: T^2/2 scored pairs per head,
2 * (192 + 128) FLOP each un-absorbed) for our varlen kernel and SDPA.
"""

from __future__ import annotations

import argparse
import datetime
from functools import partial

import torch
import torch.nn.functional as F
import triton

from atom_core.attention import PagedAttentionBackend, PagedAttentionMetadata
from atom_core.build import BuildContext
from atom_core.cache import allocate_caches, collect_cache_specs
from atom_core.config import CacheConfig, ModelConfig
from atom_core.forward_context import ForwardContext, bind_forward_context
from atom_core.loader import build_model, load_checkpoint
from atom_core.ops import varlen_causal_attention

V3 = dict(
    architectures=["DeepseekV3ForCausalLM"],
    model_type="deepseek_v3",
    vocab_size=1024,
    hidden_size=7168,
    intermediate_size=18432,
    moe_intermediate_size=2048,
    num_hidden_layers=1,
    first_k_dense_replace=1,
    n_routed_experts=256,
    num_experts_per_tok=8,
    n_shared_experts=1,
    n_group=8,
    topk_group=4,
    kv_lora_rank=512,
    q_lora_rank=1536,
    qk_rope_head_dim=64,
    qk_nope_head_dim=128,
    v_head_dim=128,
    max_position_embeddings=16384,
    rope_theta=10000.0,
    rms_norm_eps=1e-6,
    torch_dtype="bfloat16",
)
BLOCK = 64


def layer_for(heads: int):
    config = ModelConfig.from_hf_dict({**V3, "num_attention_heads": heads, "num_key_value_heads": heads})
    backends = {
        name: PagedAttentionBackend(kernel_backend="triton", mla_unabsorbed_min_tokens=threshold)
        for name, threshold in (("absorbed", None), ("unabsorbed", 1))
    }
    models = {}
    for name, backend in backends.items():
        model = build_model(config, BuildContext(backend, device="cuda"))
        load_checkpoint(model, None, load_format="dummy")
        models[name] = model.model.layers[0].self_attn
    return config, models


def timed(fn) -> float:
    return triton.testing.do_bench(fn, warmup=5, rep=60, return_mode="median")


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    rows, record = (
        [],
        dict(date=datetime.date.today().isoformat(), device=torch.cuda.get_device_name(), rows=[]),
    )
    for heads in (128, 16):
        config, layers = layer_for(heads)
        for tokens, seqs in ((512, 1), (1024, 1), (2048, 1), (4096, 1), (8192, 1), (8192, 8)):
            n = tokens // seqs
            pages = -(-n // BLOCK)
            caches = allocate_caches(
                collect_cache_specs(layers["absorbed"]),
                CacheConfig(block_size=BLOCK),
                dtype=torch.bfloat16,
                num_blocks=seqs * pages + 1,
                device="cuda",
            )
            tables = [list(range(1 + s * pages, 1 + (s + 1) * pages)) for s in range(seqs)]
            meta = PagedAttentionMetadata.build(
                query_lens=[n] * seqs,
                seq_lens=[n] * seqs,
                block_tables=tables,
                block_size=BLOCK,
                device="cuda",
            )
            hidden = torch.randn(tokens, config.hidden_size, device="cuda", dtype=torch.bfloat16)
            positions = torch.arange(n, device="cuda").repeat(seqs)
            ms, outs = {}, {}
            with bind_forward_context(ForwardContext({"paged": meta}, caches)), torch.no_grad():
                for name, layer in layers.items():
                    outs[name] = layer(positions, hidden)
                    ms[name] = timed(partial(layer, positions, hidden))
            err = (
                (outs["absorbed"] - outs["unabsorbed"]).float().abs().max()
                / outs["absorbed"].float().abs().max()
            ).item()
            q, k = (torch.randn(tokens, heads, 192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            v = torch.randn(tokens, heads, 128, device="cuda", dtype=torch.bfloat16)
            cu = torch.arange(0, tokens + 1, n, device="cuda", dtype=torch.int32)
            ours = timed(
                partial(varlen_causal_attention, q, k, v, cu_seqlens=cu, max_seq_len=n, softmax_scale=0.07)
            )
            qs, ks, vs = (x.view(seqs, n, heads, -1).transpose(1, 2) for x in (q, k, v))
            sdpa = timed(partial(F.scaled_dot_product_attention, qs, ks, vs, is_causal=True, scale=0.07))
            flops = seqs * heads * n * (n + 1) / 2 * 2 * (192 + 128)
            row = dict(
                heads=heads,
                tokens=tokens,
                seqs=seqs,
                absorbed_ms=ms["absorbed"],
                unabsorbed_ms=ms["unabsorbed"],
                speedup=ms["absorbed"] / ms["unabsorbed"],
                rel_diff=err,
                varlen_ms=ours,
                varlen_tflops=flops / ours / 1e9,
                sdpa_ms=sdpa,
                sdpa_tflops=flops / sdpa / 1e9,
                x_sdpa=sdpa / ours,
            )
            record["rows"].append(row)
            rows.append(row)
            print(row, flush=True)
            del caches
    print(f"\nMLA fresh prefill, DeepSeek-V3 attention layer (dummy bf16), {record['device']}")
    print(
        f"{'heads':>5} {'T':>6} {'seqs':>4} {'absorbed':>9} {'unabs.':>8} {'speedup':>7} {'varlen TF/s':>11} {'SDPA TF/s':>9} {'x SDPA':>6}"
    )
    for r in rows:
        print(
            f"{r['heads']:>5} {r['tokens']:>6} {r['seqs']:>4} {r['absorbed_ms']:8.3f}ms {r['unabsorbed_ms']:7.3f}ms "
            f"{r['speedup']:6.2f}x {r['varlen_tflops']:11.0f} {r['sdpa_tflops']:9.0f} {r['x_sdpa']:6.2f}"
        )
    return record


if __name__ == "__main__":
    main()
