"""Keyed sampling (a sampled token's draw depends on its sequence's seed, sample index and output position
alone) and responses' numbers staying finite (logprobs floored at vLLM's -9999.0)."""

import json
import math

import pytest
import torch

from atom_core.engine import LLM, SamplingParams
from atom_core.engine.sampling.sampler import LOGPROB_FLOOR, draw_key, sample, sample_token
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.engine.speculation.verify import verify

SAMPLED = SamplingParams(temperature=0.8, top_p=0.95, seed=7)


def test_a_draw_depends_on_seed_index_and_position_alone():
    a, b = Sequence("a", 0, [1, 2, 3], SAMPLED), Sequence("b", 0, [9], SAMPLED)
    b.append(4, None)  # another request, another history: the same key draws the same uniform
    assert [draw_key(a, i) for i in range(5)] == [draw_key(b, i) for i in range(5)]
    draws = {draw_key(Sequence("r", n, [1], SAMPLED), i) for n in range(4) for i in range(50)}
    assert len(draws) == 200 and all(0 <= k < 2**64 for k in draws)
    other = Sequence("r", 0, [1], SamplingParams(temperature=0.8, seed=8))
    assert draw_key(other, 0) != draw_key(a, 0)


def test_unseeded_sequences_draw_their_own_seed_from_torchs_generator():
    unseeded = SamplingParams(temperature=1.0)
    torch.manual_seed(3)
    first = [Sequence("r", i, [1], unseeded).sample_seed for i in range(3)]
    torch.manual_seed(3)
    assert [Sequence("r", i, [1], unseeded).sample_seed for i in range(3)] == first
    assert len(set(first)) == 3 and all(0 <= s < 2**64 for s in first)


def test_a_token_of_probability_zero_is_never_drawn_and_a_nan_row_fails_alone():
    logits = torch.full((40,), -1e30)  # finite, with weight 0 at any temperature
    logits[[3, 17]] = torch.tensor([0.0, 2.0])
    for position in range(40):
        for params in (
            SAMPLED,
            SamplingParams(temperature=1.0, seed=2),
            SamplingParams(temperature=5.0, top_k=30),
        ):
            assert sample_token(logits, Sequence("r", 0, [1], params), position) in (3, 17)
    bad = logits.clone()
    bad[5] = float("nan")
    seqs = [Sequence("r", i, [1], SAMPLED) for i in range(2)]
    got = sample(torch.stack([bad, logits]), seqs)
    assert got.tokens[0] is None and "non-finite" in got.errors[0] and got.tokens[1] in (3, 17)


def test_verify_emits_the_tokens_plain_sampling_draws_whatever_the_drafts():
    """At each position the coupling emits the token plain sampling draws there (same distribution, same
    keyed uniform): the drafts only decide how many positions one step covers."""
    logits = torch.randn(4, 12, generator=torch.Generator().manual_seed(0))
    for seed in range(20):
        params = SamplingParams(temperature=0.8, top_p=0.95, seed=seed)
        seq = Sequence("r", 0, [1, 2], params)
        seq.append(5, None)  # positions start at len(output_token_ids) = 1
        plain = [sample_token(logits[j], seq, 1 + j) for j in range(4)]
        assert sample(logits[:1], [seq]).tokens == plain[:1]
        wrong = [(t + 1) % 12 for t in plain]
        for draft in (plain[:3], plain[:1] + wrong[1:3], wrong[:3], plain[:2], []):
            got = verify(logits[: len(draft) + 1], [seq], [draft]).tokens[0]
            n_kept = next(
                (j for j, (d, t) in enumerate(zip(draft, plain, strict=False)) if d != t), len(draft)
            )
            assert got == plain[: n_kept + 1]


@pytest.fixture(scope="module")
def checkpoint(tiny_llama):
    return tiny_llama()[1]


@pytest.mark.parametrize("penalty", [1e-39, 1e-300])
def test_a_tiny_repetition_penalty_returns_finite_logprobs(checkpoint, penalty):
    """A penalty this small takes every unseen token's logit to -inf (the row is shifted to the largest
    penalized one): their logprobs, in the top 5, come back as vLLM's floor, -9999.0, which JSON carries,
    where -inf failed a response (500) or streamed `-Infinity`."""
    llm = LLM(checkpoint, kernel_backend="torch", block_size=4, num_kv_blocks=64)
    prompt = {"prompt_token_ids": [10, 20, 30, 40, 50]}
    outs = []
    for temperature in (0.0, 1.0):
        params = SamplingParams(
            temperature=temperature,
            seed=1,
            repetition_penalty=penalty,
            logprobs=5,
            max_tokens=6,
            ignore_eos=True,
        )
        outs += [o for r in llm.generate(prompt, params) for o in r.outputs]
    values = [v for o in outs for step in o.logprobs for v in step.values()]
    assert all(math.isfinite(v) and v >= LOGPROB_FLOOR for v in values)
    assert LOGPROB_FLOOR in values  # the floor was reached: -inf was there to floor
    body = [{"token_ids": o.token_ids, "logprobs": o.logprobs} for o in outs]
    json.dumps(body, allow_nan=False)
