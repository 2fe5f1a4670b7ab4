"""A DeepSeek-V3-shaped slice in the native engine on a GPU (dummy bf16 weights): hidden 7168, 128 heads,
q-LoRA 1536, latent 512 + 64, 256 experts top-8 (8 groups, top-4 groups), one dense and three MoE layers,
a 1024-token vocabulary (so the head does not hide the layers). Prints a table; the runner keeps the result.

  python -m benchmarks run deepseek_v3_slice

Per batch (B = 1 / 64 / 256 sequences of 512 prompt tokens, decoding): the decode forward alone (CUDA-graph
replay, as the engine runs it) per layer, against the per-layer floor: the bytes the step must read (the
attention weights, the dense MLP or the experts the batch touches at uniform routing plus the shared expert,
the latent cache) over the copy bandwidth measured in the same run. Dummy weights route every token to
the same experts (the router's scores are all near 0.5, so the dummy correction bias picks); the routers
are re-drawn so scores vary by token as a trained model's do (the floor counts the experts uniform routing
touches: 1 - (1 - 8/256)^B of them).
"""

from __future__ import annotations

import argparse
import datetime
import tempfile

import torch
from transformers import DeepseekV3Config

from atom_core.engine import LLM
from benchmarks.harness.ceilings import copy_bandwidth
from benchmarks.harness.engine_timing import PROMPT, step_ms
from benchmarks.harness.routers import redraw_llm_routers
from benchmarks.harness.shapes import LAYERS, v3_slice


def floor_bytes(c: DeepseekV3Config, batch: int) -> float:
    """bf16 bytes one decode step of `batch` sequences reads in the LAYERS layers."""
    h, heads = c.hidden_size, c.num_attention_heads
    qk = c.qk_nope_head_dim + c.qk_rope_head_dim
    attn = h * c.q_lora_rank + c.q_lora_rank * heads * qk + h * (c.kv_lora_rank + c.qk_rope_head_dim)
    attn += c.kv_lora_rank * heads * (c.qk_nope_head_dim + c.v_head_dim) + heads * c.v_head_dim * h
    expert = 3 * h * c.moe_intermediate_size
    touched = c.n_routed_experts * (1 - (1 - c.num_experts_per_tok / c.n_routed_experts) ** batch)
    moe = (c.n_shared_experts + touched) * expert + c.n_routed_experts * h
    dense = 3 * h * c.intermediate_size
    latent = batch * (PROMPT + 16) * (c.kv_lora_rank + c.qk_rope_head_dim)
    dense_layers = c.first_k_dense_replace
    weights = LAYERS * attn + dense_layers * dense + (LAYERS - dense_layers) * moe
    return 2 * (weights + LAYERS * latent)


def main() -> dict:
    parser = argparse.ArgumentParser()
    parser.parse_args()
    config = v3_slice()
    bandwidth = copy_bandwidth()
    record = dict(
        date=datetime.date.today().isoformat(),
        device=torch.cuda.get_device_name(),
        copy_TBps=bandwidth / 1e12,
    )
    rows = []
    with tempfile.TemporaryDirectory() as path:
        config.save_pretrained(path)
        llm = LLM(
            path,
            load_format="dummy",
            max_model_len=PROMPT + 144,
            max_num_seqs=256,
            num_kv_blocks=256 * 48,
            max_num_batched_tokens=8192,
        )
        redraw_llm_routers(llm, config.hidden_size)
        for batch in (1, 64, 256):
            whole, forward = step_ms(llm, config.vocab_size, batch, steps=12)
            floor = floor_bytes(config, batch) / bandwidth * 1e3
            entry = dict(
                batch=batch,
                step_ms=whole,
                forward_ms=forward,
                forward_per_layer_ms=forward / LAYERS,
                floor_per_layer_ms=floor / LAYERS,
                forward_over_floor=forward / floor,
            )
            record[f"B{batch}"] = entry
            rows.append(entry)
            print(entry, flush=True)
        llm.engine.shutdown()
    print(
        f"\nDeepSeek-V3 slice ({LAYERS} layers: 1 dense + 3 MoE), {record['device']}, copy {bandwidth / 1e12:.2f} TB/s"
    )
    print(f"{'B':>4} {'step ms':>8} {'forward ms':>10} {'per layer':>9} {'floor/layer':>11} {'x floor':>7}")
    for r in rows:
        print(
            f"{r['batch']:>4} {r['step_ms']:8.2f} {r['forward_ms']:10.2f} {r['forward_per_layer_ms']:9.3f} "
            f"{r['floor_per_layer_ms']:11.3f} {r['forward_over_floor']:7.2f}"
        )
    return record


if __name__ == "__main__":
    main()
