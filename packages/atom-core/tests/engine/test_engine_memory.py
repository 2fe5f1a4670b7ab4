"""An engine's GPU memory over its life (vLLM's gpu_memory_utilization and LLM.shutdown): each engine asks
for its share when it starts; shutting it down (or leaving `with LLM(...)`) hands its weights, caches and
graphs back, so the next engine in the same process gets the whole share again, even while the first
LLM object is still referred to; one dropped without a shutdown is collected when the next one starts."""

import pytest
import torch

from atom_core import LLM, SamplingParams

pytestmark = pytest.mark.gpu(reason="the GPU's memory budget needs a GPU")

ARGS = dict(dtype="float32", max_model_len=256, max_num_seqs=8, gpu_memory_utilization=0.8)
PROMPT = [{"prompt_token_ids": [5, 9, 2, 7]}]
GREEDY = SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)


def test_an_engine_shut_down_hands_its_memory_to_the_next(tiny_llama):
    _, path = tiny_llama()
    torch.cuda.empty_cache()
    held_before = torch.cuda.memory_reserved()
    with LLM(path, **ARGS) as first:
        want = first.generate(PROMPT, GREEDY)[0].outputs[0].token_ids
        blocks = first.engine.plan.num_blocks
        assert torch.cuda.memory_reserved() > held_before + (1 << 30)  # the cache took its share
    # `first` is still referred to, but what it held is back with the device (all but PyTorch's and the
    # kernels' small process-wide buffers)
    assert torch.cuda.memory_reserved() <= held_before + (256 << 20)
    with pytest.raises(RuntimeError, match=r"^this engine was shut down and takes no more requests"):
        first.generate(PROMPT, GREEDY)
    second = LLM(path, **ARGS)  # a second 0.8 share fits only because the first one's is free
    assert second.engine.plan.num_blocks >= 0.98 * blocks
    assert second.generate(PROMPT, GREEDY)[0].outputs[0].token_ids == want
    del second  # dropped, not shut down: the next engine's start collects it
    third = LLM(path, **ARGS)
    assert third.engine.plan.num_blocks >= 0.98 * blocks
    third.shutdown()
    third.shutdown()  # a second call does nothing


def test_a_share_that_is_not_free_is_refused_when_the_engine_starts(tiny_llama):
    _, path = tiny_llama()
    with (
        LLM(path, **ARGS),
        pytest.raises(ValueError, match=r"^gpu_memory_utilization 0.8 asks for .* but only .* GiB are free"),
    ):
        LLM(path, **ARGS)
