"""Qwen3-Next and Qwen3.5 (dense and MoE; Gated DeltaNet + gated attention hybrids) against transformers,
fp32 on the CPU: a ragged batch prefilled together gives transformers' logits for every prompt token, and
the engine (state slots beside the paged KV cache, chunked prefill, preemption) gives its greedy tokens;
each prompt runs alone on the reference side. Qwen3.5-MoE also loads from fused 3-D expert tensors."""

import json

import pytest
import torch
from core_fixtures.references import hf_greedy, ragged_prefill_logits, torch_reference_ops

from atom_core.config import ConfigError, ModelConfig, ParallelConfig
from atom_core.engine import LLM, EngineConfig, SamplingParams
from atom_core.engine.execution.model_runner import ModelRunner
from tools.testing_qwen import ARCHS, CONFIG, qwen3_next_checkpoint


@pytest.fixture(scope="module", autouse=True)
def torch_reference_ops_on_the_cpu():
    """On the CPU every op runs its torch reference (the engine's kernel_backend reaches attention only; the
    interpreter would run norms, DeltaNet and MoE over hundreds of rows for minutes). The Triton kernels
    meet transformers in test_gdn_layer.py (interpreter) and in the GPU test below."""
    with torch_reference_ops():
        yield


@pytest.fixture(scope="module", params=list(ARCHS))
def checkpoint(request, tmp_path_factory):
    path = tmp_path_factory.mktemp(request.param)
    return path, qwen3_next_checkpoint(path, request.param)


# shorter and longer than the 64-token DeltaNet chunk, and one of three tokens
PROMPTS = [
    [5, 17, 42, 9, 100, 3, 77, 31, 2, 8, 64, 19, 150],
    [8, 8, 150],
    [(7 * i) % 190 + 2 for i in range(70)],
]
STEPS = 32


def test_prefill_logits_match_transformers(checkpoint):
    path, hf = checkpoint
    logits = torch.cat(ragged_prefill_logits(path, PROMPTS, state_slots=[2, 0, 1]))
    offset = 0
    for p in PROMPTS:
        with torch.no_grad():
            ref = hf(torch.tensor([p])).logits[0]
        got = logits[offset : offset + len(p)]
        torch.testing.assert_close(got, ref, rtol=0, atol=1e-4 * max(ref.abs().max().item(), 1.0))
        offset += len(p)


def test_engine_greedy_matches_transformers_with_chunks_and_preemption(checkpoint):
    path, hf = checkpoint
    # 30 blocks of 4 cannot hold all three sequences (47 blocks): one is preempted and recomputed (its state
    # starts over)
    llm = LLM(
        path,
        kernel_backend="torch",
        dtype="float32",
        block_size=4,
        num_kv_blocks=30,
        max_num_batched_tokens=24,  # prompts prefill in chunks: the DeltaNet state carries across them
    )
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for p, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, p, STEPS)
    engine = llm.engine
    assert engine.scheduler.num_chunked_prefills > 0 and engine.scheduler.num_preemptions > 0


def test_layer_types_are_checked_by_name():
    hf = {
        "architectures": ["Qwen3NextForCausalLM"],
        **CONFIG,
        "layer_types": ["linear_attention", "mamba"] * 2,
    }
    from atom_core.registry import get_model_spec

    config = ModelConfig.from_hf_dict(hf)
    with pytest.raises(ConfigError, match=r"layer_types must name each of the 4 layers .* 'mamba'"):
        get_model_spec("Qwen3NextForCausalLM").attention_kinds(config)


@pytest.mark.gpu(reason="CUDA graphs and the Triton GDN kernels need a GPU")
def test_hybrid_decode_graphs_on_a_gpu(checkpoint):
    """fp32 on the GPU: Triton DeltaNet, attention and MoE kernels, decode steps replaying CUDA graphs that
    read and write the state slots; greedy tokens are transformers'."""
    path, hf = checkpoint
    llm = LLM(path, dtype="float32", max_model_len=128, max_num_seqs=4, num_kv_blocks=64)
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for p, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, p, STEPS)
    assert llm.engine.runner.graphs is not None and llm.engine.runner.graphs.decode.replays > 0
    llm.engine.shutdown()


@pytest.mark.parametrize(
    "heads", [(24, 48), (48, 24), (96, 192)], ids=["dk24-dv48", "dk48-dv24", "dk96-dv192"]
)
def test_deltanet_heads_that_are_not_powers_of_two_match_transformers(tmp_path, heads):
    """Key and value head sizes transformers accepts but Triton's blocks are not (the kernels pad and mask
    them): greedy tokens through chunked prefill and decode equal transformers'. On a GPU the Triton
    kernels run, decode steps replaying CUDA graphs; on the CPU their torch references."""
    dk, dv = heads
    hf = qwen3_next_checkpoint(tmp_path, "qwen3.5", linear_key_head_dim=dk, linear_value_head_dim=dv)
    gpu = torch.cuda.is_available()
    llm = LLM(
        tmp_path,
        kernel_backend=None if gpu else "torch",
        dtype="float32",
        block_size=16 if gpu else 4,
        num_kv_blocks=64,
        max_num_batched_tokens=24,  # the 70-token prompt prefills in chunks
        max_model_len=128,
        max_num_seqs=4,
    )
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outs = llm.generate([{"prompt_token_ids": p} for p in PROMPTS], params)
    for p, out in zip(PROMPTS, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(hf, p, 16)
    if gpu:
        assert llm.engine.runner.graphs.decode.replays > 0
    llm.engine.shutdown()


@pytest.mark.parametrize("case", ["qwen3-next", "qwen3.5-moe"])  # grouped and split DeltaNet projections
def test_tensor_parallel_2_over_gloo_equals_1(tmp_path, case):
    """TP=2 on the CPU: each rank keeps one key head's DeltaNet (its value heads, conv channels and state),
    half the attention heads and expert columns; greedy tokens and logprobs equal TP=1's."""
    qwen3_next_checkpoint(tmp_path, case)
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, logprobs=2)
    args = dict(kernel_backend="torch", dtype="float32", block_size=4, num_kv_blocks=64, device="cpu")
    prompts = [{"prompt_token_ids": p} for p in PROMPTS]
    single = LLM(tmp_path, **args).generate(prompts, params)
    tp = LLM(tmp_path, **args, tensor_parallel_size=2)
    try:
        got = tp.generate(prompts, params)
    finally:
        tp.shutdown()
    for g, w in zip(got, single, strict=True):
        assert g.outputs[0].token_ids == w.outputs[0].token_ids
        for lg, lw in zip(g.outputs[0].logprobs, w.outputs[0].logprobs, strict=True):
            assert lg.keys() == lw.keys() and max(abs(lg[t] - lw[t]) for t in lg) < 1e-4


def test_three_row_positions_take_interleaved_mrope_as_transformers(tmp_path):
    """Qwen3.5 with [3, T] positions whose rows differ (as an image's tokens have): logits equal
    transformers' given the same position_ids; a model without mrope_section refuses them by name."""
    from atom_core.attention import PagedAttentionMetadata
    from atom_core.cache import StateMetadata
    from atom_core.cache.specs import PAGED, STATE
    from atom_core.forward_context import ForwardContext, bind_forward_context

    def forward(path, positions):
        config = ModelConfig.from_pretrained(path)
        engine = EngineConfig(
            model=path, num_kv_blocks=32, kernel_backend="torch", block_size=4, dtype="float32"
        )
        runner = ModelRunner(config, engine, parallel=ParallelConfig(), device=torch.device("cpu"))
        n = positions.shape[-1]
        paged = PagedAttentionMetadata.build(
            query_lens=[n], seq_lens=[n], block_tables=[list(range(8))], block_size=4, device="cpu"
        )
        state = StateMetadata.build(slots=[0], fresh=[True], query_lens=[n])
        with (
            torch.no_grad(),
            bind_forward_context(ForwardContext({PAGED: paged, STATE: state}, runner.caches)),
        ):
            return runner.model.compute_logits(runner.model(torch.tensor(PROMPTS[0]), positions))

    hf = qwen3_next_checkpoint(tmp_path / "q35", "qwen3.5")
    t = torch.arange(len(PROMPTS[0]))
    positions = torch.stack([t, t // 3, t % 4])
    got = forward(tmp_path / "q35", positions)
    with torch.no_grad():
        want = hf(torch.tensor([PROMPTS[0]]), position_ids=positions[:, None]).logits[0]
        plain = hf(torch.tensor([PROMPTS[0]])).logits[0]
    torch.testing.assert_close(got, want, rtol=0, atol=1e-4 * want.abs().max().item())
    assert (want - plain).abs().max() > 1e-2  # the rows' difference matters
    qwen3_next_checkpoint(tmp_path / "next", "qwen3-next")
    next_config = tmp_path / "next" / "config.json"
    config = json.loads(next_config.read_text())
    config["rope_parameters"].pop("mrope_section")
    next_config.write_text(json.dumps(config))
    with pytest.raises(
        ValueError, match=r"positions of shape \(3, 13\) need a model with rope mrope_section"
    ):
        forward(tmp_path / "next", positions)


def test_a_forward_plans_the_deltanet_chunks_once(tmp_path, monkeypatch):
    """The chunk plan depends on the forward's sequences alone: the first GDN layer makes it, the others
    (CONFIG has two) take it from the state metadata; decode steps make none."""
    from atom_core.cache import metadata

    made = []
    real = metadata.plan_chunks
    monkeypatch.setattr(
        metadata, "plan_chunks", lambda cu, tokens, lens=None: made.append(tokens) or real(cu, tokens, lens)
    )
    qwen3_next_checkpoint(tmp_path, "qwen3.5-moe")
    assert CONFIG["layer_types"].count("linear_attention") == 2
    llm = LLM(
        tmp_path, kernel_backend="torch", dtype="float32", max_model_len=128, max_num_batched_tokens=256
    )
    params = SamplingParams(temperature=0, max_tokens=3, ignore_eos=True)
    llm.generate([{"prompt_token_ids": PROMPTS[0]}, {"prompt_token_ids": PROMPTS[1]}], params)
    assert made == [len(PROMPTS[0]) + len(PROMPTS[1])]  # one prefill forward of both prompts
