"""Speculative decoding with forced drafts: an oracle (Drafter.oracle) proposes, for each sequence, tokens
taken from the plain (non-speculative) run of the same requests, right always, never, or for the first j
drafts of each step. What the engine must then do is exact, whatever the numerics of the draft model:

- the outputs (tokens and logprobs; greedy, and seeded sampling) are the plain ones;
- a step that verifies drafts d accepts exactly min(j, len(d)) of them (len(d) when always right, 0 when
  always wrong), so the engine's counters and each output's equal the sum of those over the verified
  drafts, which the test records as the scheduler hands them to a step (it may verify fewer than were
  proposed: short of KV blocks or of the step's token budget).

On a random tiny DeepSeek-V3 with an MTP layer (MLA KV; one process, and tensor-parallel over gloo), a
random tiny GLM-4.5 with one (paged MHA KV) and a random tiny Qwen3-Next (Gated DeltaNet state layers:
the state after the last accepted draft is committed, after partially accepted drafts too), roomy and with a KV cache so small that drafts are dropped and
sequences preempted, prefills chunked and prefixes hit. fp32 on the CPU, torch reference ops.
"""

from collections import defaultdict

import pytest
import torch
from core_fixtures.checkpoints import deepseek_mtp_checkpoint
from core_fixtures.drafts import language_prompts, mtp
from core_fixtures.references import torch_reference_ops

from atom_core.engine import LLM, SamplingParams
from atom_core.engine.execution.step_inputs import prepare_step
from atom_core.engine.steps import pipeline
from tools.testing_qwen import qwen_mtp_checkpoint


@pytest.fixture(scope="module", autouse=True)
def torch_reference_ops_on_the_cpu():
    """On the CPU every op of this file's engines runs its torch reference (see test_speculative.py)."""
    with torch_reference_ops():
        yield


VOCAB = 211  # both tiny models'
# (on a GPU a test holds up to three of these engines at once, each asking for its share of the memory)
COMMON = dict(kernel_backend="torch", block_size=4, dtype="float32", gpu_memory_utilization=0.3)
ALWAYS = None  # right_for: every draft right


def mixed_params(n_requests: int, max_tokens: int) -> list[SamplingParams]:
    """Greedy and seeded sampled requests in turn (the second one with two samples, keyed by index)."""
    params = []
    for i in range(n_requests):
        if i % 2 == 0:
            params.append(SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True, logprobs=2))
        else:
            params.append(
                SamplingParams(
                    n=2 if i == 1 else 1,
                    temperature=0.8,
                    top_p=0.95,
                    seed=40 + i,
                    max_tokens=max_tokens,
                    ignore_eos=True,
                    logprobs=2,
                )
            )
    return params


class ForcedDrafts:
    """The oracle: a sequence's draft j, the guess for output position p = len(output_token_ids) + j, is
    the plain run's token at p if j < right_for (right_for ALWAYS: every draft), else that token + 1 (a
    wrong one). Past the plain output (never reached: the requests ignore EOS and the drafter drafts no
    further than max_tokens) it proposes the draft model's own guess, and counts it in `beyond`.

    Installed on an engine, it also records the length of every draft list a step verifies, per sample
    (`verified`), and counts the scheduled sequences that verify fewer drafts than were proposed
    (`dropped`)."""

    def __init__(self, plain, right_for: int | None):
        self.plain = {(out.request_id, o.index): o.token_ids for out in plain for o in out.outputs}
        self.right_for = right_for
        self.verified: dict[tuple[str, int], list[int]] = defaultdict(list)
        self.dropped = self.beyond = self.ahead_calls = 0

    def __call__(self, seq, j: int, token: int) -> int:
        want = self.plain[(seq.request_id, seq.index)]
        position = len(seq.output_token_ids) + j
        if position >= len(want):
            self.beyond += 1
            return token
        right = want[position]
        return right if self.right_for is ALWAYS or j < self.right_for else (right + 1) % VOCAB

    def ahead(self, seqs, j: int, positions: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The same choice on the device, for verifies launched ahead (Drafter.ahead_oracle): draft j of
        each of seqs, at output positions the host has not read yet. Past the plain output (a verify
        launched ahead drafts k even near max_tokens; those drafts are never counted) the draft's guess."""
        keys = list(self.plain)
        width = max(map(len, self.plain.values()))
        table = torch.tensor([self.plain[key] + [0] * (width - len(self.plain[key])) for key in keys])
        lengths = torch.tensor([len(self.plain[key]) for key in keys])
        rows = torch.tensor([keys.index((seq.request_id, seq.index)) for seq in seqs])
        positions = positions.cpu()
        right = table[rows, positions.clamp(max=width - 1)]
        if not (self.right_for is ALWAYS or j < self.right_for):
            right = (right + 1) % VOCAB
        self.ahead_calls += 1
        return torch.where(positions < lengths[rows], right, tokens.cpu()).to(tokens.device)

    def install(self, llm: LLM) -> None:
        engine = llm.engine
        engine.drafter.oracle = self
        schedule = engine.scheduler.schedule

        def recording():
            batch = schedule()
            for seq, draft in zip(batch.seqs, batch.drafts, strict=True):
                assert draft == seq.draft_token_ids[: len(draft)]  # a prefix of what was proposed
                if draft:
                    self.verified[(seq.request_id, seq.index)].append(len(draft))
                self.dropped += len(draft) < len(seq.draft_token_ids)
            return batch

        engine.scheduler.schedule = recording

    def accepts(self, n: int) -> int:
        """How many of n verified drafts the target must accept: the right ones before the first wrong."""
        return n if self.right_for is ALWAYS else min(self.right_for, n)

    def expected_accepted(self, key=None) -> int:
        lists = self.verified.values() if key is None else [self.verified.get(key, [])]
        return sum(self.accepts(n) for lengths in lists for n in lengths)

    @property
    def lengths(self) -> list[int]:
        return [n for lengths in self.verified.values() for n in lengths]


def generate(path, prompts, params, **engine):
    llm = LLM(path, **COMMON, **engine)
    return llm, llm.generate([{"prompt_token_ids": p} for p in prompts], params)


def speculate(path, prompts, params, plain, k: int, right_for: int | None, **engine):
    """The requests again under speculation with k drafts forced by a ForcedDrafts from `plain`: the
    outputs equal plain's, and the counters (engine's, each output's) are exactly what the forced drafts
    imply. Returns (engine, oracle)."""
    llm = LLM(path, **COMMON, speculative_config=mtp(k), **engine)
    try:
        oracle = ForcedDrafts(plain, right_for)
        oracle.install(llm)
        spec = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        engine = llm.engine
        assert [r.request_id for r in spec] == [r.request_id for r in plain]  # the oracle's keys
        for want, got in zip(plain, spec, strict=True):
            assert len(got.outputs) == len(want.outputs)
            for w, g in zip(want.outputs, got.outputs, strict=True):
                where = f"request {got.request_id} sample {g.index}"
                assert g.token_ids == w.token_ids, where
                assert g.finish_reason == w.finish_reason, where
                for lw, lg in zip(w.logprobs, g.logprobs, strict=True):
                    assert lw.keys() == lg.keys(), where
                    assert max(abs(lw[t] - lg[t]) for t in lw) < 1e-4, where
                key = (got.request_id, g.index)
                assert g.num_draft_tokens == sum(oracle.verified.get(key, [])), where
                assert g.num_accepted_tokens == oracle.expected_accepted(key), where
        stats = engine.stats
        lengths = oracle.lengths
        assert stats.num_draft_tokens == sum(lengths) > 0
        assert stats.num_verifications == len(lengths)
        assert stats.num_accepted_tokens == oracle.expected_accepted()
        assert stats.num_draft_tokens == sum(o.num_draft_tokens for r in spec for o in r.outputs)
        assert stats.num_accepted_tokens == sum(o.num_accepted_tokens for r in spec for o in r.outputs)
        assert oracle.beyond == 0
    except BaseException:  # tensor-parallel workers are stopped, whatever failed
        llm.shutdown()
        raise
    return engine, oracle


def check_forced(oracle: ForcedDrafts, stats, k: int) -> None:
    """What each kind of oracle must have made happen (beyond speculate's exact accounting)."""
    lengths, right_for = oracle.lengths, oracle.right_for
    if right_for is ALWAYS:
        assert stats.num_accepted_tokens == stats.num_draft_tokens
        if k > 1:  # several drafts accepted in one step
            assert max(lengths) == k
    elif right_for == 0:
        assert stats.num_accepted_tokens == 0
    else:
        if right_for == 1:
            assert stats.num_accepted_tokens == stats.num_verifications
        # some steps accepted right_for drafts, then rejected the next one (KV and state rolled back)
        assert any(n > right_for for n in lengths)
        assert stats.num_accepted_tokens < stats.num_draft_tokens


# DeepSeek-V3 (MLA) -------------------------------------------------------------------------------------

DS_PROMPTS = language_prompts(VOCAB, [9, 23, 3, 14, 30])
DS_PROMPTS.append(DS_PROMPTS[1][:20] + DS_PROMPTS[0][:5])  # shares five blocks with prompt 1: prefix hits
DS_PARAMS = mixed_params(len(DS_PROMPTS), 20)
ROOMY = dict(num_kv_blocks=128)
# 17 blocks of 4 hold the longest sequence (50 tokens and 4 drafts) but not all seven: sequences are
# preempted and drafts dropped, whatever the drafts' acceptance
DS_TIGHT = dict(num_kv_blocks=17, max_num_batched_tokens=16, max_num_seqs=6)


@pytest.fixture(scope="module")
def deepseek(tmp_path_factory):
    path = tmp_path_factory.mktemp("oracle-deepseek")
    deepseek_mtp_checkpoint(path)
    return path


@pytest.fixture(scope="module")
def deepseek_plain(deepseek):
    return generate(deepseek, DS_PROMPTS, DS_PARAMS, **ROOMY)[1]


@pytest.mark.parametrize(
    "k, right_for",
    [(1, ALWAYS), (4, ALWAYS), (2, 0), (3, 1), (3, 2)],
    ids=["k1-always-right", "k4-always-right", "k2-always-wrong", "k3-right-for-1", "k3-right-for-2"],
)
def test_forced_drafts_are_accepted_exactly_as_far_as_they_are_right(deepseek, deepseek_plain, k, right_for):
    engine, oracle = speculate(deepseek, DS_PROMPTS, DS_PARAMS, deepseek_plain, k, right_for, **ROOMY)
    check_forced(oracle, engine.stats, k)
    assert engine.scheduler.num_preemptions == 0 and oracle.dropped == 0  # every proposal verified


@pytest.mark.parametrize(
    "k, right_for", [(3, ALWAYS), (3, 1), (4, 2)], ids=["k3-always-right", "k3-right-for-1", "k4-right-for-2"]
)
def test_forced_drafts_under_preemption_dropped_drafts_chunks_and_prefix_hits(
    deepseek, deepseek_plain, k, right_for
):
    engine, oracle = speculate(deepseek, DS_PROMPTS, DS_PARAMS, deepseek_plain, k, right_for, **DS_TIGHT)
    check_forced(oracle, engine.stats, k)
    assert engine.scheduler.num_preemptions > 0 and engine.blocks.num_prefix_hits > 0
    assert engine.scheduler.num_chunked_prefills > 0 and oracle.dropped > 0


def test_forced_drafts_under_tensor_parallelism(deepseek, deepseek_plain):
    """TP=2 over gloo: target and draft split their MLA heads and experts over both ranks; the oracle
    forces the proposals the draft's steps on every rank produced."""
    n = 4
    engine, oracle = speculate(
        deepseek,
        DS_PROMPTS[:n],
        DS_PARAMS[:n],
        deepseek_plain[:n],
        3,
        2,
        tensor_parallel_size=2,
        device="cpu",
        **ROOMY,
    )
    try:
        check_forced(oracle, engine.stats, 3)
    finally:
        engine.shutdown()


def proposals(path, prompts, params, from_host: bool, **engine) -> tuple[list, int, int]:
    """Every draft list each verify step verified, step by step: (request, sample, drafts) of each
    sequence that verified some; how many steps caught up before the host read the target's draws; and
    how many verify forwards took their drafts on the device (from the chain, read by the host only after
    the forward was queued). from_host: chained through the identity oracle (each chained forward fed from
    the host after a read, the catch-up after the read too, the drafts read before the verify step) instead
    of on the device. Every verify forward's token ids are checked against the ids the host builds from the
    drafts it verifies."""
    # the synchronous verify is the subject (on a GPU async scheduling would launch verifies ahead, past
    # verify_step: their own tests are below)
    llm = LLM(path, **COMMON, speculative_config=mtp(3), async_scheduling=False, **engine)
    verify_step = pipeline.verify_step
    try:
        drafter, log, fed = llm.engine.drafter, [], [0]
        if from_host:
            drafter.oracle = lambda seq, j, token: token
        runner = llm.engine.runner
        model = getattr(runner, "runner", runner).model  # (rank 0's, under tensor parallelism)
        forward, seen = model.forward, []

        def seeing(ids, *args, **kwargs):
            seen.append(ids.tolist())
            return forward(ids, *args, **kwargs)

        def verifying(batch, inputs, *args):
            assert seen[-1] == prepare_step(batch).ids  # the forward saw the drafts the host verifies
            fed[0] += inputs.fed_source == "drafts" and bool(inputs.fed_rows)
            verified = zip(batch.seqs, batch.drafts, strict=True)
            log.append([(s.request_id, s.index, list(d)) for s, d in verified if d])
            return verify_step(batch, inputs, *args)

        catch_up, early = drafter.catch_up, []

        def counting(*args):
            caught_up = catch_up(*args)
            early.append(caught_up is not None)
            return caught_up

        model.forward, drafter.catch_up, pipeline.verify_step = seeing, counting, verifying
        llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    finally:
        pipeline.verify_step = verify_step
        llm.shutdown()
    return log, sum(early), fed[0]


@pytest.mark.parametrize(
    "engine",
    [ROOMY, DS_TIGHT, dict(tensor_parallel_size=2, device="cpu", **ROOMY)],
    ids=["roomy", "preemption-dropped-drafts-chunks", "tensor-parallel"],
)
def test_drafts_chained_on_the_device_are_the_ones_chained_from_the_host(deepseek, engine):
    """Chained draft forwards feed on the previous one's argmax on the device, the catch-up on the verify
    step's draws before the host reads them, and the next verify forward on the proposals before the host
    reads those; the identity oracle reads each and feeds it from the host, after the read: the same
    drafts verified, step by step, whatever the cache does, and every verify forward saw them."""
    n = 4 if "tensor_parallel_size" in engine else len(DS_PROMPTS)
    device, early, fed = proposals(deepseek, DS_PROMPTS[:n], DS_PARAMS[:n], False, **engine)
    host, late, fed_by_host = proposals(deepseek, DS_PROMPTS[:n], DS_PARAMS[:n], True, **engine)
    assert device == host
    assert early > 0 and late == 0
    assert fed > 0 and fed_by_host == 0
    assert any(len(drafts) == 3 for step in device for *_, drafts in step)  # chains ran to their end


@pytest.mark.parametrize(
    "model, k, right_for",
    [("deepseek", 2, ALWAYS), ("deepseek", 2, 0), ("deepseek", 3, 1), ("qwen", 3, 2), ("qwen", 2, ALWAYS)],
    ids=[
        "ds-k2-always-right",
        "ds-k2-always-wrong",
        "ds-k3-right-for-1",
        "gdn-k3-right-for-2",
        "gdn-k2-always",
    ],
)
def test_forced_drafts_launched_ahead_are_accepted_as_the_synchronous_ones(request, model, k, right_for):
    """Verifies launched ahead (async scheduling), their drafts forced on the device (Drafter.ahead_oracle)
    as the host's oracle forces the synchronous ones: the outputs (tokens, logprobs) are the plain ones, and
    the drafts, acceptances and verifications counted are exactly the synchronous run's, whose counts
    check_forced checks against the forcing; on Qwen3-Next each verify starts from the state of the last
    accepted draft of the one before, which the device picked."""
    path, prompts, params = (
        (request.getfixturevalue("deepseek"), DS_PROMPTS, DS_PARAMS)
        if model == "deepseek"
        else (request.getfixturevalue("qwen"), QWEN_PROMPTS, QWEN_PARAMS)
    )
    plain = request.getfixturevalue(f"{model}_plain")
    sync, oracle = speculate(path, prompts, params, plain, k, right_for, **ROOMY)
    check_forced(oracle, sync.stats, k)
    llm = LLM(path, **COMMON, speculative_config=mtp(k), async_scheduling=True, **ROOMY)
    forcing = ForcedDrafts(plain, right_for)
    llm.engine.drafter.oracle, llm.engine.drafter.ahead_oracle = (
        forcing,
        forcing.ahead,
    )  # (synchronous steps too)
    got = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    for want, out in zip(plain, got, strict=True):
        for w, g in zip(want.outputs, out.outputs, strict=True):
            assert g.token_ids == w.token_ids, (out.request_id, g.index)
            for lw, lg in zip(w.logprobs, g.logprobs, strict=True):
                assert lw.keys() == lg.keys() and max(abs(lw[t] - lg[t]) for t in lw) < 1e-4
    stats = llm.engine.stats
    counted = ("num_draft_tokens", "num_accepted_tokens", "num_verifications")
    assert [getattr(stats, c) for c in counted] == [getattr(sync.stats, c) for c in counted]
    assert stats.num_async_steps > 0 and forcing.ahead_calls > 0
    slots = llm.engine.scheduler.state_slots
    assert slots is None or slots.num_free == slots.num_slots


# GLM-4.5 (its MTP layer: DeepSeek's structure around a GLM decoder layer, paged MHA KV) ---------------


@pytest.fixture(scope="module")
def glm(tmp_path_factory):
    from transformers import Glm4MoeConfig

    from tools.testing_models import TINY_ARCHITECTURES, TINY_DIMS, random_deepseek_mtp_checkpoint

    fields = dict(TINY_DIMS, **TINY_ARCHITECTURES["Glm4MoeForCausalLM"], vocab_size=VOCAB)
    return random_deepseek_mtp_checkpoint(
        fields, tmp_path_factory.mktemp("oracle-glm"), config_class=Glm4MoeConfig
    )


@pytest.fixture(scope="module")
def glm_plain(glm):
    return generate(glm, DS_PROMPTS, DS_PARAMS, **ROOMY)[1]


@pytest.mark.parametrize(
    "k, right_for, cache",
    [(4, ALWAYS, "roomy"), (3, 2, "roomy"), (3, 1, "tight")],
    ids=["k4-always-right", "k3-right-for-2", "k3-right-for-1-tight"],
)
def test_glm_forced_drafts_are_accepted_exactly_as_far_as_they_are_right(glm, glm_plain, k, right_for, cache):
    engine, oracle = speculate(
        glm, DS_PROMPTS, DS_PARAMS, glm_plain, k, right_for, **(ROOMY if cache == "roomy" else DS_TIGHT)
    )
    check_forced(oracle, engine.stats, k)
    if cache == "tight":
        assert (
            engine.scheduler.num_preemptions > 0 and engine.blocks.num_prefix_hits > 0 and oracle.dropped > 0
        )


# Qwen3-Next (Gated DeltaNet state layers) --------------------------------------------------------------

# longer than the 64-token DeltaNet chunk, short, one of two tokens; the last shares 16 tokens with the
# second (a prefix hit resumes a state snapshot)
QWEN_PROMPTS = language_prompts(VOCAB, [9, 70, 2, 14, 30])
QWEN_PROMPTS.append(QWEN_PROMPTS[1][:16] + QWEN_PROMPTS[0][:3])
QWEN_PARAMS = mixed_params(len(QWEN_PROMPTS), 24)
# 40 blocks of 4 do not hold all seven sequences: some are preempted and recomputed (their state too)
QWEN_TIGHT = dict(num_kv_blocks=40, max_num_batched_tokens=16, max_num_seqs=5)


@pytest.fixture(scope="module")
def qwen(tmp_path_factory):
    path = tmp_path_factory.mktemp("oracle-qwen3-next")
    qwen_mtp_checkpoint(path, "qwen3-next")
    return path


@pytest.fixture(scope="module")
def qwen_plain(qwen):
    return generate(qwen, QWEN_PROMPTS, QWEN_PARAMS, **QWEN_TIGHT)[1]


@pytest.mark.parametrize(
    "k, right_for, tight",
    [(2, ALWAYS, True), (1, 0, True), (3, 1, True), (3, 2, True), (3, 2, False)],
    ids=["k2-always-right", "k1-always-wrong", "k3-right-for-1", "k3-right-for-2", "k3-right-for-2-roomy"],
)
def test_gdn_state_after_the_last_accepted_draft_is_committed(qwen, qwen_plain, k, right_for, tight):
    """A verify step keeps the state after each of its tokens; the engine keeps the one after the last
    accepted draft (after a partial acceptance too): any other would change every later token. Under
    preemption (state recomputed), chunked prefill and prefix hits (state snapshots resumed), and in a
    roomy cache (every running sequence verifying k drafts a step)."""
    config = QWEN_TIGHT if tight else ROOMY
    engine, oracle = speculate(qwen, QWEN_PROMPTS, QWEN_PARAMS, qwen_plain, k, right_for, **config)
    check_forced(oracle, engine.stats, k)
    scheduler = engine.scheduler
    if tight:
        assert scheduler.num_preemptions > 0 and scheduler.num_chunked_prefills > 0
        assert engine.blocks.num_prefix_hits > 0 and oracle.dropped > 0
    else:
        assert scheduler.num_preemptions == 0 and oracle.dropped == 0
    assert scheduler.state_slots.num_free == scheduler.state_slots.num_slots  # all given back
