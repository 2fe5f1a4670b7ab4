"""Prefill graphs (engine/execution/prefill_graphs.py) on the CPU: the static-buffer forward a graph
captures, run eagerly on a tiny GDN hybrid through the Triton kernels (interpreter), gives the eager
step's logits and leaves the same KV rows and states, padded rows and sequences included, and it reads
nothing back on the host (a capture would fail). Replays on the GPU: test_cuda_graphs.py."""

from typing import ClassVar

import pytest
import torch
import triton.runtime.interpreter as interpreter
from torch.utils._python_dispatch import TorchDispatchMode

from atom_core.cache import StateCache
from atom_core.cache.specs import PAGED, STATE
from atom_core.engine import LLM, SamplingParams
from atom_core.engine.execution.prefill_graphs import PrefillGraphs, pad_layout
from atom_core.engine.execution.step_inputs import StepInputs, prepare_step
from tools.testing_qwen import qwen3_next_checkpoint


def test_layouts_pad_with_one_sequence_per_missing_one_and_the_rest_in_the_last():
    assert pad_layout([5, 3], 8, 2).query_lens == [5, 3]  # exact: no padding
    assert pad_layout([5, 3], 16, 2) is None  # padded rows need a padding sequence
    layout = pad_layout([5, 3], 16, 4)
    assert layout.query_lens == [5, 3, 1, 7] and layout.cu == [0, 5, 8, 9, 16] and layout.real == 2
    assert pad_layout([5, 3], 9, 4) is None  # two padding sequences need two rows
    assert pad_layout([5, 3, 1], 8, 4) is None  # more tokens than captured
    assert pad_layout([1] * 5, 16, 4) is None  # more sequences than captured


class HostReads(TorchDispatchMode):
    """Torch ops outside the Triton interpreter that read a device value on the host."""

    READS: ClassVar = {"_local_scalar_dense", "nonzero", "masked_select"}  # (.item() dispatches the first)

    def __init__(self):
        super().__init__()
        self.reads, self.inside_triton = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.inside_triton and func.overloadpacket.__name__ in self.READS:
            self.reads.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))

    def __enter__(self):
        self.run = run = interpreter.InterpretedFunction.run

        def quiet(fn_self, *args, **kwargs):
            self.inside_triton += 1
            try:
                return run(fn_self, *args, **kwargs)
            finally:
                self.inside_triton -= 1

        interpreter.InterpretedFunction.run = quiet
        return super().__enter__()

    def __exit__(self, *exc):
        interpreter.InterpretedFunction.run = self.run
        return super().__exit__(*exc)


@pytest.fixture(scope="module")
def hybrid(tmp_path_factory):
    path = tmp_path_factory.mktemp("qwen3.5-moe")
    qwen3_next_checkpoint(path, "qwen3.5-moe")
    return LLM(
        path, kernel_backend="triton", dtype="float32", block_size=4, num_kv_blocks=64, max_model_len=64,
        max_num_batched_tokens=32, enforce_eager=True,
    )  # fmt: skip


def _cache_tensors(caches) -> list[torch.Tensor]:
    """Every KV and state tensor of the caches (views: they change with the caches)."""
    return [t for c in caches for t in (c.states.values() if isinstance(c, StateCache) else (c.k, c.v))]


def test_the_captured_forward_equals_the_eager_step(hybrid):
    engine = hybrid.engine
    runner = engine.runner
    params = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    # two fresh prompts in one step of 21 tokens: replayed at 32 tokens and 4 sequences (two padding
    # ones); each passes its last cacheable block inside the chunk, so both keep a snapshot
    for i, n in enumerate((9, 12)):
        engine.add_request({"prompt_token_ids": [(5 * j + i) % 90 + 3 for j in range(n)]}, params, f"r{i}")
    inputs = prepare_step(engine.scheduler.schedule())
    assert inputs.query_lens == [9, 12] and sum(s >= 0 for s in inputs.snapshot_slots) == 2
    graphs = PrefillGraphs(
        runner.model, runner.caches, {PAGED, STATE}, tokens=[16, 32], seqs=[1, 2, 4], max_model_len=64,
        block_size=4, device=runner.device, capture=False,
    )  # fmt: skip
    assert graphs.serves(inputs) and graphs.layout_for(inputs).query_lens == [9, 12, 1, 10]
    tensors = _cache_tensors(runner.caches)
    before = [t.clone() for t in tensors]
    with torch.inference_mode():
        eager_logits, eager_hidden, _ = runner._forward(inputs, None, None)
        eager_caches = [t.clone() for t in tensors]
        for t, saved in zip(tensors, before, strict=True):
            t.copy_(saved)
        with HostReads() as reads:
            logits = graphs.run(inputs)
    assert reads.reads == []
    torch.testing.assert_close(logits, eager_logits, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(graphs.hidden, eager_hidden, rtol=1e-4, atol=1e-4)
    for got, want in zip(tensors, eager_caches, strict=True):  # KV rows, states and snapshots
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    for request_id in list(engine.requests):
        engine.abort(request_id)


def test_steps_a_graph_cannot_replay_run_eagerly(hybrid):
    runner = hybrid.engine.runner
    graphs = PrefillGraphs(
        runner.model, runner.caches, {PAGED, STATE}, tokens=[16], seqs=[1, 2], max_model_len=64,
        block_size=4, device=runner.device, capture=False,
    )  # fmt: skip

    def step(lens, **fields):
        ids = [1] * sum(lens)
        inputs = StepInputs(ids, list(range(len(ids))), lens, lens, [[0]] * len(lens), [], [-1] * len(lens),
                            [True] * len(lens), [sum(lens) - 1])  # fmt: skip
        for name, value in fields.items():
            setattr(inputs, name, value)
        return inputs

    assert graphs.serves(step([7, 9])) and graphs.serves(step([7]))
    assert not graphs.serves(step([17]))  # more tokens than captured
    assert not graphs.serves(step([3, 3, 3]))  # more sequences
    assert not graphs.serves(step([7], step_slots=[0] * 7))  # a verify keeps every token's state
    assert not graphs.serves(step([7], prompt_rows=[1]))  # prompt scores read every row's logits
    assert not graphs.serves(step([7], logit_rows=[5, 6]))  # drafts' logits
    with pytest.raises(NotImplementedError, match=r"no static buffers for \['latent'\] caches"):
        PrefillGraphs(None, [], {"latent"}, tokens=[16], seqs=[1], max_model_len=8, block_size=4,
                      device=torch.device("cpu"), capture=False)  # fmt: skip


@pytest.mark.parametrize(
    ("engine", "layer_kinds", "tokens", "seqs"),
    [
        (dict(), {"mha", "gdn"}, (16, 32, 64, 128, 256, 512), (1, 2, 4, 8)),
        (dict(max_num_seqs=2, max_num_batched_tokens=100), {"mha"}, (16, 32, 64), (1, 2, 3)),
        (dict(max_prefill_graph_tokens=8192), {"mla"}, (16, 32, 64, 128, 256, 512, 1024), (1, 2, 4, 8)),
        (dict(max_prefill_graph_tokens=0), {"mha"}, (), ()),
        (dict(enforce_eager=True), {"mha"}, (), ()),
    ],
)
def test_the_plan_captures_prefill_steps_at_powers_of_two(engine, layer_kinds, tokens, seqs):
    """Token counts from 16 up to max_prefill_graph_tokens and the step budget (MLA: below the lengths
    whose attention the host picks), sequence counts up to max_num_seqs and a padding one."""
    from atom_core.config import ModelConfig
    from atom_core.engine import EngineConfig
    from atom_core.engine.plan import plan_engine

    model = ModelConfig.from_hf_dict(
        {"architectures": ["LlamaForCausalLM"], "hidden_size": 64, "num_hidden_layers": 1,
         "num_attention_heads": 2, "num_key_value_heads": 1, "vocab_size": 64, "intermediate_size": 64,
         "max_position_embeddings": 4096, "torch_dtype": "bfloat16"}
    )  # fmt: skip
    config = EngineConfig(**{"num_kv_blocks": 512, "kernel_backend": "triton", **engine})
    plan = plan_engine(
        config, model, {PAGED}, device=torch.device("cuda"), fit_blocks=None, layer_kinds=layer_kinds
    )
    assert plan.prefill_graph_tokens == tokens and plan.prefill_graph_seqs == seqs
    off = dict(plan.off)
    assert ("prefill CUDA graphs" in off) == (engine.get("max_prefill_graph_tokens") == 0)
