"""SamplingParams.prompt_logprobs against transformers: each prompt token's logprob (and the top ones)
given the tokens before it, through chunked prefill of a ragged batch, never from the prefix cache; one
list a request, in its first output when outputs are deltas; echo with logprobs on the server."""

import pytest
import torch

from atom_core.engine import LLM, OutputKind, SamplingParams

PROMPTS = [
    [5, 17, 99, 3, 42, 8, 120, 64, 7, 7, 31, 2, 90, 11, 45, 60, 13, 88, 9, 140, 22],
    [77, 6, 150, 19],
    [4, 4],
]
TOP = 3


# on a GPU, also through its Triton kernels, CUDA graphs and async scheduling (which such requests leave)
DEVICES = [dict(device="cpu", kernel_backend="torch")]
if torch.cuda.is_available():
    DEVICES.append(dict(device="cuda", gpu_memory_utilization=0.3))


@pytest.fixture(scope="module", params=DEVICES, ids=lambda d: d["device"])
def model_and_llm(tiny_llama, request):
    model, path = tiny_llama()
    # 8 tokens a step: the first prompt's rows are scored across three chunks, beside the others'
    with LLM(str(path), num_kv_blocks=64, max_model_len=64, max_num_batched_tokens=8, **request.param) as llm:
        yield model, llm


def _close(llm) -> float:
    on_cpu = llm.engine.config.device == "cpu"
    return 1e-4 if on_cpu else 2e-3  # (fp32 GEMMs of the GPU's kernels may round through TF32)


def _reference(model, prompt: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(torch.tensor([prompt])).logits[0].float().log_softmax(-1)  # [len, V]


def _generate(llm, prompts, **fields):
    params = SamplingParams(temperature=0, max_tokens=2, **fields)
    return llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)


def test_each_prompt_token_is_scored_as_transformers_scores_it(model_and_llm):
    model, llm = model_and_llm
    tol = _close(llm)
    for prompt, out in zip(PROMPTS, _generate(llm, PROMPTS, prompt_logprobs=TOP), strict=True):
        ref = _reference(model, prompt)
        scored = out.prompt_logprobs
        assert len(scored) == len(prompt) and scored[0] is None
        for p in range(1, len(prompt)):
            entry, expected = scored[p], ref[p - 1]
            assert entry[prompt[p]] == pytest.approx(expected[prompt[p]].item(), abs=tol)
            best = expected.topk(TOP)
            for token, value in zip(best.indices.tolist(), best.values.tolist(), strict=True):
                assert entry[token] == pytest.approx(value, abs=tol)
            assert set(entry) == {prompt[p], *best.indices.tolist()}


def test_zero_gives_the_prompt_tokens_alone_and_none_asks_nothing(model_and_llm):
    _, llm = model_and_llm
    zero, plain = _generate(llm, PROMPTS[:1], prompt_logprobs=0)[0], _generate(llm, PROMPTS[:1])[0]
    assert [None if e is None else list(e) for e in zero.prompt_logprobs] == [None] + [
        [t] for t in PROMPTS[0][1:]
    ]
    assert plain.prompt_logprobs is None
    assert zero.outputs[0].token_ids == plain.outputs[0].token_ids  # scoring changes nothing sampled


def test_a_cached_prefix_is_computed_again_for_its_scores(model_and_llm):
    _, llm = model_and_llm
    blocks = llm.engine.scheduler.blocks
    _generate(llm, PROMPTS[:1])  # its full blocks are cached now
    hits = blocks.num_prefix_hits
    _generate(llm, PROMPTS[:1])
    assert blocks.num_prefix_hits > hits  # a request without scores reuses them
    hits = blocks.num_prefix_hits
    first, again = (_generate(llm, PROMPTS[:1], prompt_logprobs=1)[0] for _ in range(2))
    assert blocks.num_prefix_hits == hits
    assert first.prompt_logprobs == again.prompt_logprobs


def test_one_list_a_request_with_n_samples_and_in_the_first_delta_only(model_and_llm):
    _, llm = model_and_llm
    (whole,) = llm.generate(
        [{"prompt_token_ids": PROMPTS[1]}],
        SamplingParams(n=2, temperature=1.0, seed=1, max_tokens=3, prompt_logprobs=1),
        use_tqdm=False,
    )
    assert len(whole.outputs) == 2 and len(whole.prompt_logprobs) == len(PROMPTS[1])
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=3, prompt_logprobs=1, output_kind=OutputKind.DELTA)
    engine.add_request({"prompt_token_ids": PROMPTS[1]}, params, request_id="delta")
    outputs = []
    while engine.has_unfinished_requests():
        outputs += [o for o in engine.step() if o.request_id == "delta"]
    assert len(outputs) == 3
    first = outputs[0].prompt_logprobs  # (the same scores; a batch of another shape moves the last bit)
    assert first[0] is None and [list(e) for e in first[1:]] == [list(e) for e in whole.prompt_logprobs[1:]]
    for got, expected in zip(first[1:], whole.prompt_logprobs[1:], strict=True):
        assert list(got.values()) == pytest.approx(list(expected.values()), abs=_close(llm))
    assert all(o.prompt_logprobs is None for o in outputs[1:])


@pytest.mark.parametrize("value", [-1, 21, 1.5])
def test_out_of_range_is_refused_by_name(value):
    with pytest.raises(ValueError, match="prompt_logprobs must be"):
        SamplingParams(prompt_logprobs=value)
