"""Prefix caching for the Gated DeltaNet hybrids, fp32 on the CPU: a request whose prompt shares a cached
prefix reuses its KV blocks and the GDN state kept at a block boundary of it, and produces exactly the
tokens of an engine without prefix caching (itself equal to transformers in test_qwen3_next_parity.py).
Snapshots are evicted with their blocks, or least recently used first when all are held."""

import pytest
import torch
from core_fixtures.references import torch_reference_ops

from atom_core.engine import LLM, SamplingParams
from atom_core.engine.scheduling.block_manager import BlockManager
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.engine.state.state_snapshots import StateSnapshots
from tools.testing_qwen import qwen3_next_checkpoint


@pytest.fixture(scope="module", autouse=True)
def torch_reference_ops_on_the_cpu():
    """On the CPU every op runs its torch reference (see test_qwen3_next_parity.py)."""
    with torch_reference_ops():
        yield


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3-next")
    qwen3_next_checkpoint(path, "qwen3-next")
    return path


BASE = [(7 * i) % 190 + 2 for i in range(70)]  # past the 64-token DeltaNet chunk
PROMPTS = [
    BASE,
    [*BASE[:45], 9, 10, 11],  # shares 11 blocks: resumes from the last kept boundary inside them
    BASE,  # the same prompt again: resumes at its last full block
    [*BASE, 100, 101, 102, 103, 104, 105],
    BASE[:5],
]
PARAMS = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
ENGINE = dict(kernel_backend="torch", dtype="float32", block_size=4, max_num_batched_tokens=16)


def generate(llm, prompts):
    first = llm.generate([{"prompt_token_ids": prompts[0]}], PARAMS)  # cached before the others arrive
    return first + llm.generate([{"prompt_token_ids": p} for p in prompts[1:]], PARAMS)


@pytest.fixture(scope="module")
def uncached(checkpoint):
    llm = LLM(checkpoint, **ENGINE, num_kv_blocks=200, state_snapshots=0)
    assert not llm.engine.blocks.prefix_caching
    return generate(llm, PROMPTS)


def assert_same(got, want):
    for g, w in zip(got, want, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for lg, lw in zip(g.outputs[0].logprobs, w.outputs[0].logprobs, strict=True):
            assert lg.keys() == lw.keys() and max(abs(lg[t] - lw[t]) for t in lg) < 1e-4


@pytest.mark.parametrize(
    ("engine", "preempted"),
    [
        (dict(num_kv_blocks=200), False),
        (dict(num_kv_blocks=32), True),  # preemption mid-prefill: recomputed from the kept states
        (dict(num_kv_blocks=200, state_snapshots=2), False),  # snapshots evicted least recently used
        # steps launched before the last one's tokens are read: the states advance on the device
        (dict(num_kv_blocks=200, async_scheduling=True), False),
        (dict(num_kv_blocks=32, async_scheduling=True), True),
    ],
)
def test_hits_resume_the_kept_state_and_equal_the_uncached_tokens(checkpoint, uncached, engine, preempted):
    llm = LLM(checkpoint, **ENGINE, **engine)
    got = generate(llm, PROMPTS)
    assert_same(got, uncached)
    e = llm.engine
    assert e.blocks.num_prefix_hits > 0 and e.scheduler.num_state_restores > 0
    assert (e.scheduler.num_preemptions > 0) == preempted
    assert (e.blocks.snapshots.num_evicted > 0) == ("state_snapshots" in engine)
    assert e.scheduler.state_slots.num_free == e.scheduler.state_slots.num_slots
    assert (e.stats.num_async_steps > 0) == bool(engine.get("async_scheduling"))


def test_snapshots_are_evicted_with_their_blocks_and_least_recently_used_first():
    snapshots = StateSnapshots([10, 11])
    blocks = BlockManager(4, 2, snapshots=snapshots)
    seq = Sequence("a", 0, [5, 6, 7, 8, 9], SamplingParams())
    blocks.admit(seq)
    blocks.allocate(seq, 5)
    seq.num_computed_tokens = 4
    blocks.register_full_blocks(seq)
    first, second = snapshots.reserve(), snapshots.reserve()
    snapshots.commit(seq.block_keys[0], first)
    snapshots.commit(seq.block_keys[1], second)
    assert snapshots.reserve() == first and len(snapshots) == 1  # all held: the least recently used goes
    snapshots.release(first)
    blocks.release(seq)
    again = Sequence("b", 0, [5, 6, 7, 8, 9], SamplingParams())
    assert blocks.admit(again) == 2 and again.restore_slot == second  # both blocks, the state after them
    blocks.release(again)
    other = Sequence("c", 0, [1, 2, 3, 4, 1, 2, 3, 4], SamplingParams())
    blocks.admit(other)
    blocks.allocate(other, 8)  # takes every free block: the cached ones' contents are evicted
    assert len(snapshots) == 0 and snapshots.reserve() is not None


def test_bf16_recurrent_state_halves_its_memory_and_stays_close(checkpoint, uncached):
    from atom_core.cache import StateCache
    from atom_core.config import ConfigError
    from atom_core.engine import EngineConfig

    llm = LLM(checkpoint, **ENGINE, num_kv_blocks=200, state_cache_dtype="bfloat16")
    states = [c.states for c in llm.engine.runner.caches if isinstance(c, StateCache)]
    assert states and all(s["recurrent"].dtype == torch.bfloat16 for s in states)
    got = llm.generate([{"prompt_token_ids": p} for p in PROMPTS[:2]], PARAMS)
    for g, w in zip(got, uncached[:2], strict=True):  # chunked prefills carry the rounded state
        first_g, first_w = g.outputs[0].logprobs[0], w.outputs[0].logprobs[0]
        assert first_g.keys() == first_w.keys()
        assert max(abs(first_g[t] - first_w[t]) for t in first_g) < 2e-2
    with pytest.raises(ConfigError, match="state_cache_dtype must be one of float32, bfloat16, got 'fp8'"):
        EngineConfig(state_cache_dtype="fp8")
