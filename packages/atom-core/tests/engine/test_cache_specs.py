"""Caches come from the layers: each attention-like layer declares a cache spec, the engine allocates exactly
those (shapes, windows, heads on this rank), and the layer kinds agree with the registry's."""

import pytest
import torch
from core_fixtures.engine import TokenCounter
from core_fixtures.references import hf_greedy
from torch import nn
from transformers import Qwen3Config

from atom_core import LLM, SamplingParams
from atom_core.attention import PagedAttentionBackend
from atom_core.build import BuildContext
from atom_core.cache import (
    LatentCache,
    LatentCacheSpec,
    LayerKVCache,
    PagedKVSpec,
    StateCache,
    StateCacheSpec,
    allocate_caches,
    bytes_per_block,
    bytes_per_slot,
    collect_cache_specs,
)
from atom_core.config import CacheConfig, ModelConfig, ParallelConfig
from atom_core.loader import build_model
from atom_core.registry import get_model_spec
from tools.testing_models import random_checkpoint

# Alternating sliding (window 6) and full layers; head_dim differs from hidden / heads.
MIXED = dict(
    vocab_size=97,
    hidden_size=48,
    intermediate_size=64,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=20,
    max_position_embeddings=128,
    use_sliding_window=True,
    sliding_window=6,
    layer_types=["sliding_attention", "full_attention"] * 2,
)
DECLARED = [PagedKVSpec(2, 20, 6), PagedKVSpec(2, 20, None)] * 2


@pytest.fixture(scope="module")
def mixed_checkpoint(tmp_path_factory):
    return random_checkpoint(Qwen3Config(**MIXED), tmp_path_factory.mktemp("mixed") / "ckpt")[1]


def _model(path, parallel=None):
    config = ModelConfig.from_pretrained(path)
    ctx = BuildContext(PagedAttentionBackend(kernel_backend="torch"), parallel=parallel or ParallelConfig())
    return config, build_model(config, ctx)


def test_each_layer_declares_its_cache_and_the_kinds_match_the_registry(mixed_checkpoint):
    config, model = _model(mixed_checkpoint)
    specs = collect_cache_specs(model)
    assert specs == DECLARED
    assert [s.layer_kind for s in specs] == ["sliding", "mha"] * 2
    assert tuple(s.layer_kind for s in specs) == get_model_spec(config.architecture).attention_kinds(config)


def test_heads_on_a_rank_are_what_its_cache_holds(mixed_checkpoint):
    # Two ranks (not initialized: building only): each holds one of the two KV heads.
    _, model = _model(mixed_checkpoint, ParallelConfig(tp_size=2, tp_rank=1))
    assert collect_cache_specs(model) == [PagedKVSpec(1, 20, 6), PagedKVSpec(1, 20, None)] * 2


@pytest.mark.parametrize("layout, kv_dtype", [("flash", "auto"), ("shuffle", "auto"), ("flash", "fp8")])
def test_the_caches_allocated_are_the_declared_ones(layout, kv_dtype):
    cache = CacheConfig(block_size=16, layout=layout, kv_dtype=kv_dtype)
    paged = [PagedKVSpec(2, 16, 6), PagedKVSpec(1, 32, None)] * 2  # the shuffle layout wants D % 8 == 0
    specs = [
        *paged,
        LatentCacheSpec(40),
        StateCacheSpec((("conv", (8, 3), None), ("ssm", (2, 4, 4), torch.float32))),
    ]
    caches = allocate_caches(specs, cache, dtype=torch.float16, num_blocks=5, num_slots=3, device="cpu")
    assert [type(c) for c in caches] == [LayerKVCache] * 4 + [LatentCache, StateCache]
    used = 0
    for spec, layer in zip(paged, caches, strict=False):
        assert layer.k.numel() == layer.v.numel() == 5 * 16 * spec.num_kv_heads * spec.head_dim
        assert layer.k.dtype == (torch.float8_e4m3fn if kv_dtype == "fp8" else torch.float16)
        assert (layer.k_scale is not None) == (kv_dtype == "fp8")
        if layout == "flash":
            assert layer.k.shape == (5, 16, spec.num_kv_heads, spec.head_dim)
        scales = [] if layer.k_scale is None else [layer.k_scale, layer.v_scale]
        used += sum(t.numel() * t.element_size() for t in [layer.k, layer.v, *scales])
    latent, state = caches[4], caches[5]
    assert latent.rows.shape == (5, 16, 40) and (latent.scale is not None) == (kv_dtype == "fp8")
    used += latent.rows.numel() * latent.rows.element_size()
    assert used == 5 * bytes_per_block(specs, cache, dtype=torch.float16, device=torch.device("cpu"))
    assert state.states["conv"].shape == (3, 8, 3) and state.states["conv"].dtype == torch.float16
    assert state.states["ssm"].shape == (3, 2, 4, 4) and state.states["ssm"].dtype == torch.float32
    assert bytes_per_slot(specs, dtype=torch.float16) == 8 * 3 * 2 + 2 * 4 * 4 * 4


def test_the_engine_allocates_what_the_layers_declare(mixed_checkpoint):
    llm = LLM(mixed_checkpoint, kernel_backend="torch", block_size=4, num_kv_blocks=24)
    runner = llm.engine.runner
    assert runner.cache_specs == DECLARED
    assert [c.k.shape for c in runner.caches] == [(24, 4, 2, 20)] * 4
    llm.shutdown()


class _StateLayer(nn.Module):
    """A layer with per-sequence state, as a GDN layer is."""

    cache_index = 0
    cache_spec = StateCacheSpec((("h", (4,), None),))


def test_cache_indices_must_be_unique_and_dense():
    model = nn.Module()
    model.a, model.b = _StateLayer(), _StateLayer()
    with pytest.raises(ValueError, match="both declare cache index 0"):
        collect_cache_specs(model)
    model.b.cache_index = 2
    with pytest.raises(ValueError, match=r"must be 0..1, the model declares \[0, 2\]"):
        collect_cache_specs(model)


def test_state_slots_follow_each_sequence_through_chunks_and_preemption(tiny_llama, with_token_counter):
    """A hybrid model (paged KV + a state layer): each running sequence holds a state slot that persists over
    its prefill chunks and decode steps, starts fresh (a recompute) after preemption, and is given back; no
    prefix-cache hits skip a state layer's tokens (no state snapshots: no prefix caching). Output equals the
    same model's without the state layer."""
    hf, path = tiny_llama()
    prompts = [list(range(3, 3 + n)) for n in (9, 13, 7)] + [list(range(3, 12))]  # the last repeats the first
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine_args = dict(kernel_backend="torch", block_size=4, num_kv_blocks=14, max_num_batched_tokens=8)
    llm = LLM(path, **engine_args, max_num_seqs=4, state_snapshots=0)
    engine = llm.engine
    assert engine.runner.cache_specs[-1] == TokenCounter.SPEC and engine.runner.plan.num_state_slots == 4
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    (counter,) = with_token_counter
    assert int(counter.problems) == 0
    assert engine.scheduler.num_preemptions > 0 and engine.scheduler.num_chunked_prefills > 0
    assert int(counter.fresh_starts) >= len(prompts) + engine.scheduler.num_preemptions
    assert int(counter.resumed) > 40
    assert engine.blocks.num_prefix_hits == 0 and not engine.blocks.prefix_caching
    assert engine.scheduler.state_slots.num_free == 4  # every slot given back
    llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == [hf_greedy(hf, p, 12) for p in prompts]


def test_state_snapshots_resume_cached_prefixes(tiny_llama, with_token_counter):
    """With state snapshots, a prefix-cache hit resumes the state layer from the state kept at the hit's
    last block: every resumed row's state covers exactly the positions before it (the counter finds no
    problem), hits and restores happen (prompts sharing prefixes, one repeated, preempted sequences
    recomputed), and output equals the same model's without the state layer."""
    hf, path = tiny_llama()
    base = list(range(3, 30))
    prompts = [base, [*base[:18], 40, 41, 42], [*base, 50], base[:9], base]
    params = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    llm = LLM(path, kernel_backend="torch", block_size=4, num_kv_blocks=16, max_num_batched_tokens=8)
    engine = llm.engine
    outputs = [llm.generate([{"prompt_token_ids": prompts[0]}], params)[0]]  # cached before the others run
    outputs += llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], params)
    (counter,) = with_token_counter
    assert int(counter.problems) == 0
    assert engine.blocks.prefix_caching and engine.blocks.num_prefix_hits > 0
    assert engine.scheduler.num_state_restores > 0 and engine.scheduler.num_preemptions > 0
    assert engine.scheduler.state_slots.num_free == engine.scheduler.state_slots.num_slots
    llm.shutdown()
    assert [o.outputs[0].token_ids for o in outputs] == [hf_greedy(hf, p, 10) for p in prompts]
