"""Decode steps replayed from CUDA graphs give the tokens eager steps give (GPU only: graphs need CUDA)."""

import pytest
from transformers import GptOssConfig, LlamaConfig, Qwen3MoeConfig

from atom_core.engine import LLM, SamplingParams
from tools.testing_models import random_checkpoint
from tools.testing_mxfp4 import mxfp4_checkpoint

pytestmark = pytest.mark.gpu(reason="CUDA graphs need a GPU")

PROMPTS = [[(5 * i + 2) % 500 + 1 for i in range(n)] for n in (7, 120, 33, 64, 1)]
MAX_TOKENS = [24, 9, 30, 17, 12]  # the batch shrinks as requests finish: several captured sizes replay


def _checkpoint(tmp_path, cls, **kw):
    config = cls(
        vocab_size=512,
        hidden_size=256,
        intermediate_size=512,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=2,
        max_position_embeddings=512,
        **kw,
    )
    return random_checkpoint(config, tmp_path / "ckpt")[1]


GPT_OSS = dict(num_local_experts=4, num_experts_per_tok=2, sliding_window=16)  # windows shorter than prompts


@pytest.mark.parametrize(
    ("cls", "kw", "mxfp4"),
    [
        (LlamaConfig, {}, False),
        (Qwen3MoeConfig, dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=128), False),
        (GptOssConfig, GPT_OSS, False),  # sinks, alternating windows, biased experts
        (GptOssConfig, GPT_OSS, True),  # the same with MXFP4 experts
    ],
    ids=["llama", "qwen3-moe", "gpt-oss", "gpt-oss-mxfp4"],
)
def test_graph_replays_equal_eager_steps(tmp_path, cls, kw, mxfp4):
    path = _checkpoint(tmp_path, cls, **kw)
    if mxfp4:
        path = mxfp4_checkpoint(path, tmp_path / "mxfp4")
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    outputs = {}
    # eager and synchronous; graphs and synchronous; graphs with async scheduling (the default): each
    # replay's ids fed from the last one's argmax on the device, also as the batch shrinks
    for eager, asynchronous in ((True, False), (False, False), (False, True)):
        llm = LLM(
            path,
            dtype="float32",
            max_model_len=256,
            max_num_seqs=8,
            gpu_memory_utilization=0.3,  # (the engine of the loop before is still alive)
            enforce_eager=eager,
            async_scheduling=asynchronous,
        )
        outputs[eager, asynchronous] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        graphs = llm.engine.runner.graphs and llm.engine.runner.graphs.decode
        if eager:
            assert graphs is None
        else:
            assert graphs.sizes == [1, 2, 4, 8] and graphs.replays >= max(MAX_TOKENS) - 1
        assert (llm.engine.stats.num_async_steps >= max(MAX_TOKENS) - 2) == asynchronous
        llm.shutdown()
    assert outputs[False, False] == outputs[True, False] == outputs[False, True]
    assert [len(t) for t in outputs[False, True]] == MAX_TOKENS


def test_a_state_layer_replays_in_graphs_as_it_runs_eagerly(tmp_path, with_token_counter):
    """State slots and fresh flags reach a state layer inside replayed decode graphs (padded rows included)."""
    path = _checkpoint(tmp_path, LlamaConfig)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in MAX_TOKENS]
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    outputs = {}
    for eager in (True, False):
        llm = LLM(
            path,
            dtype="float32",
            max_model_len=256,
            max_num_seqs=8,
            enforce_eager=eager,
            gpu_memory_utilization=0.3,
        )
        outputs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts, params)]
        counter = with_token_counter[-1]
        assert int(counter.problems) == 0 and int(counter.fresh_starts) >= len(PROMPTS)
        assert int(counter.resumed) >= sum(MAX_TOKENS) - len(PROMPTS)
        if not eager:
            assert llm.engine.runner.graphs.decode.replays >= max(MAX_TOKENS) - 1
        llm.shutdown()
    assert outputs[False] == outputs[True]


def test_prefill_steps_replay_as_they_run_eagerly(tmp_path):
    """Prefill chunks beside decodes, replayed from prefill graphs on a GDN hybrid (state slots, fresh
    flags, snapshots kept inside a chunk, padding sequences), give the eager engine's tokens; a repeated
    prompt resumes from its snapshot in both."""
    from tools.testing_qwen import qwen3_next_checkpoint

    qwen3_next_checkpoint(tmp_path, "qwen3.5-moe")
    prompts = [{"prompt_token_ids": [t % 200 for t in p]} for p in (*PROMPTS, PROMPTS[1])]  # (its vocab)
    params = [SamplingParams(temperature=0, max_tokens=n, ignore_eos=True) for n in (*MAX_TOKENS, 5)]
    outputs = {}
    for eager in (True, False):
        llm = LLM(
            tmp_path,
            dtype="float32",
            max_model_len=256,
            max_num_seqs=8,
            max_num_batched_tokens=64,  # chunks of the 120-token prompt beside the others' decodes
            gpu_memory_utilization=0.3,
            enforce_eager=eager,
        )
        outputs[eager] = [o.outputs[0].token_ids for o in llm.generate(prompts[:-1], params[:-1])]
        outputs[eager] += [o.outputs[0].token_ids for o in llm.generate(prompts[-1:], params[-1:])]
        graphs = llm.engine.runner.graphs
        if not eager:
            assert graphs.prefill.replays >= 3 and graphs.decode.replays > 0
        assert llm.engine.scheduler.num_state_restores > 0
        llm.shutdown()
    assert outputs[False] == outputs[True]
