"""MTP speculative decoding for the Gated DeltaNet hybrids (Qwen3-Next, Qwen3.5), fp32 on the CPU.

The draft's logits equal an independent reference written from the published MTP description. Under
speculation the GDN layers keep their state after every verified token and the engine keeps the accepted
one, so speculative output equals plain output token for token: on a checkpoint whose MTP layer was
trained in the test (drafts accepted, several in a row, and rejected: a rollback of state and KV), with
chunked prefill and preemption, and on random ones (mostly rejections).
"""

import pytest
import torch

from atom_core.config import ConfigError, ModelConfig, ParallelConfig
from atom_core.engine import LLM, EngineConfig, SamplingParams
from atom_core.engine.model_runner import DraftInputs, ModelRunner, StepInputs
from tools.testing_models import successor_language
from tools.testing_qwen import VOCAB, qwen_mtp_checkpoint


@pytest.fixture(scope="module", autouse=True)
def torch_reference_ops_on_the_cpu():
    """On the CPU every op runs its torch reference (see test_qwen3_next_parity.py); the kernels' step
    states meet their references in atom-kernels' test_gdn_step_states.py, and the GPU test below runs
    them under speculation through the verify CUDA graphs."""
    if torch.cuda.is_available():
        yield
        return
    from atom_kernels import settings
    from atom_kernels.settings import Backend, Settings

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(settings, "SETTINGS", Settings(Backend.TORCH, settings.SETTINGS.triton_interpret))
        yield


COMMON = dict(kernel_backend="torch", block_size=4, dtype="float32")


def mtp(k: int) -> dict:
    return {"method": "mtp", "num_speculative_tokens": k}


def language_prompts(lengths, seed=3):
    _, sample = successor_language(VOCAB)
    gen = torch.Generator().manual_seed(seed)
    return [sample(1, n, gen)[0].tolist() for n in lengths]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A tiny Qwen3-Next whose target and MTP layer were trained together on successor_language."""
    path = tmp_path_factory.mktemp("qwen-mtp-trained")
    qwen_mtp_checkpoint(path, "qwen3-next", train_steps=300)
    return path


@pytest.mark.parametrize(
    "case", ["qwen3-next", "qwen3.5", "qwen3.5-moe-fused", "qwen3.5-conditional-generation"]
)
def test_draft_logits_equal_the_reference_written_from_the_published_forward(tmp_path, case):
    main, reference = qwen_mtp_checkpoint(tmp_path, case)
    config = ModelConfig.from_pretrained(tmp_path)
    engine = EngineConfig(model=tmp_path, num_kv_blocks=32, speculative_config=mtp(1), **COMMON)
    runner = ModelRunner(
        config, engine, parallel=ParallelConfig(), device=torch.device("cpu"), max_model_len=128
    )
    tokens = language_prompts([19])[0]
    n, table = len(tokens), list(range(5))
    runner.run(StepInputs(tokens, list(range(n)), [n], [n], [table], [0], [0], [True], list(range(n))))
    logits = []
    for rows in (range(0, 7), range(7, n - 1)):  # the draft's rows in two forwards: its own KV carries over
        step = DraftInputs(
            [tokens[i + 1] for i in rows],
            list(rows),
            [len(rows)],
            [rows.stop],
            [table],
            list(rows),
            "target",
            list(range(len(rows))),
        )
        logits.append(runner.run_draft(step))
    with torch.no_grad():
        ids = torch.tensor([tokens])
        expected = reference(ids, main.model(ids).last_hidden_state)[0]
    got = torch.cat(logits)
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-4 * expected.abs().max().item())


def run(path, prompts, params, **engine):
    llm = LLM(path, **COMMON, **engine)
    outs = llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    return llm.engine, outs


# longer than the 64-token DeltaNet chunk, short, and one of two tokens
PROMPTS = language_prompts([9, 70, 2, 14, 30])
GREEDY = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True, logprobs=2)
# 40 blocks of 4 do not hold all five sequences: some are preempted and recomputed (their state too)
TIGHT = dict(num_kv_blocks=40, max_num_batched_tokens=16, max_num_seqs=5)


@pytest.fixture(scope="module")
def plain_greedy(trained):
    return run(trained, PROMPTS, GREEDY, **TIGHT)[1]


@pytest.mark.parametrize("k", [1, 3])
def test_speculative_greedy_equals_plain_with_chunks_and_preemption(trained, plain_greedy, k):
    engine, spec = run(trained, PROMPTS, GREEDY, speculative_config=mtp(k), **TIGHT)
    for p, s in zip(plain_greedy, spec, strict=True):
        assert s.outputs[0].token_ids == p.outputs[0].token_ids
        for lp, ls in zip(p.outputs[0].logprobs, s.outputs[0].logprobs, strict=True):
            assert lp.keys() == ls.keys()
            assert max(abs(lp[t] - ls[t]) for t in lp) < 1e-4
    assert engine.scheduler.num_preemptions > 0 and engine.scheduler.num_chunked_prefills > 0
    drafted, accepted = engine.num_draft_tokens, engine.num_accepted_tokens
    # the trained draft is right most of the time, several drafts in a row are accepted (the state of a
    # later position is committed), and some are rejected (their state is never used)
    assert accepted / drafted > (0.8 if k == 1 else 0.5)
    assert accepted > engine.num_verifications or k == 1
    if k >= 3:  # chained drafts miss sometimes
        assert accepted < drafted
    assert engine.scheduler.state_slots.num_free == engine.scheduler.state_slots.num_slots  # all given back


def test_random_draft_rejected_mostly_still_equals_plain(tmp_path):
    qwen_mtp_checkpoint(tmp_path, "qwen3.5-moe-fused")
    prompts = language_prompts([11, 6, 66])
    params = SamplingParams(n=2, temperature=0, max_tokens=16, ignore_eos=True)
    _, want = run(tmp_path, prompts, params, num_kv_blocks=96)
    engine, got = run(tmp_path, prompts, params, num_kv_blocks=96, speculative_config=mtp(2))
    assert [[o.token_ids for o in r.outputs] for r in got] == [[o.token_ids for o in r.outputs] for r in want]
    assert engine.num_accepted_tokens < engine.num_draft_tokens


def test_mtp_on_a_hybrid_without_mtp_weights_is_refused(tmp_path):
    from tools.testing_qwen import qwen3_next_checkpoint

    qwen3_next_checkpoint(tmp_path, "qwen3-next")
    with pytest.raises(ValueError, match=r"no MTP layer tensors \(mtp\.\*\)"):
        LLM(tmp_path, **COMMON, num_kv_blocks=16, speculative_config=mtp(1))


def test_more_than_one_mtp_layer_is_refused(tmp_path):
    import json

    qwen_mtp_checkpoint(tmp_path, "qwen3-next")
    config = json.loads((tmp_path / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 2}))
    with pytest.raises(ConfigError, match="declares 2 MTP layers: ATOM drafts with exactly one"):
        LLM(tmp_path, **COMMON, num_kv_blocks=16, speculative_config=mtp(1))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs and the Triton GDN kernels need a GPU")
def test_speculative_equals_plain_through_the_verify_graphs_on_a_gpu(trained):
    """fp32 on the GPU: verify steps replay CUDA graphs of k + 1 tokens a sequence, the Triton GDN kernels
    keeping each token's state; output is the plain engine's (itself replaying decode graphs)."""
    prompts = language_prompts([9, 70, 3, 14, 30, 17])
    params = SamplingParams(temperature=0, max_tokens=32, ignore_eos=True)
    gpu = dict(dtype="float32", max_model_len=256, max_num_seqs=8)
    plain_llm = LLM(trained, **gpu)
    want = [
        o.outputs[0].token_ids for o in plain_llm.generate([{"prompt_token_ids": p} for p in prompts], params)
    ]
    plain_llm.engine.shutdown()
    for k in (1, 3):
        llm = LLM(trained, **gpu, speculative_config=mtp(k))
        got = [
            o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p} for p in prompts], params)
        ]
        assert got == want
        assert llm.engine.runner.verify_graphs.replays > 0
        assert llm.engine.num_accepted_tokens > 0.5 * llm.engine.num_draft_tokens
        llm.engine.shutdown()
