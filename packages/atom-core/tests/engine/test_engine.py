"""The native engine: batched output equals each request alone and transformers; sampling controls behave."""

import contextlib
import dataclasses
import ipaddress
import os
from pathlib import Path

import pytest
import torch

from atom_core.demo import ensure_demo_checkpoint
from atom_core.engine import LLM, SamplingParams

GREEDY = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)


@pytest.fixture(scope="module")
def checkpoint(tiny_llama):
    return tiny_llama()


def _llm(path, **kw):
    return LLM(path, **{"kernel_backend": "torch", "block_size": 4, "num_kv_blocks": 128, **kw})


def _prompts():
    gen = torch.Generator().manual_seed(3)
    shared = torch.randint(1, 151, (13,), generator=gen).tolist()
    return [
        [*shared, 7, 8],  # shares 3 full blocks with the next one
        [*shared, 9],
        torch.randint(1, 151, (29,), generator=gen).tolist(),  # longer than the token budget below
        [4, 5],
        torch.randint(1, 151, (9,), generator=gen).tolist(),
    ]


def test_mixed_batch_with_chunking_prefix_hits_and_preemption_equals_each_request_alone(
    checkpoint, hf_greedy_tokens
):
    hf, path = checkpoint
    prompts = _prompts()
    alone = [_llm(path).generate({"prompt_token_ids": p}, GREEDY)[0].outputs[0].token_ids for p in prompts]
    for p, tokens in zip(prompts, alone, strict=True):
        assert tokens == hf_greedy_tokens(hf, p, 12)

    llm = _llm(path, num_kv_blocks=14, max_num_batched_tokens=16)  # 56 KV slots for ~125 tokens of work
    outputs = llm.generate([{"prompt_token_ids": p} for p in prompts], GREEDY)
    assert [o.outputs[0].token_ids for o in outputs] == alone
    assert all(o.outputs[0].finish_reason == "length" for o in outputs)
    scheduler = llm.engine.scheduler
    assert scheduler.num_preemptions > 0, "the tiny KV cache should have forced preemption"
    assert scheduler.num_chunked_prefills > 0, "the 29-token prompt should have been chunked"
    assert llm.engine.blocks.num_prefix_hits > 0, "the shared prefix should have hit the cache"


def test_a_repeated_prompt_reuses_its_cached_prefix(checkpoint):
    _, path = checkpoint
    llm = _llm(path)
    prompt = {"prompt_token_ids": list(range(1, 30))}
    first = llm.generate(prompt, GREEDY)[0].outputs[0].token_ids
    hits_before = llm.engine.blocks.num_prefix_hits
    assert llm.generate(prompt, GREEDY)[0].outputs[0].token_ids == first
    assert llm.engine.blocks.num_prefix_hits - hits_before == (29 - 1) // 4


def test_stop_token_ids_and_max_tokens(checkpoint):
    _, path = checkpoint
    llm = _llm(path)
    prompt = {"prompt_token_ids": [3, 1, 4, 1, 5, 9, 2, 6]}
    full = llm.generate(prompt, GREEDY)[0].outputs[0].token_ids
    stop_at = full[5]
    out = llm.generate(
        prompt, SamplingParams(temperature=0, max_tokens=12, ignore_eos=True, stop_token_ids=[stop_at])
    )[0].outputs[0]
    assert out.token_ids == full[: full.index(stop_at) + 1] and out.finish_reason == "stop"
    short = llm.generate(prompt, SamplingParams(temperature=0, max_tokens=3, ignore_eos=True))[0].outputs[0]
    assert short.token_ids == full[:3] and short.finish_reason == "length"


def test_seeds_reproduce_and_top_k_1_is_greedy(checkpoint):
    _, path = checkpoint
    llm = _llm(path)
    prompt = {"prompt_token_ids": [10, 20, 30, 40]}
    sampled = SamplingParams(
        temperature=1.0, top_p=0.9, top_k=50, min_p=0.01, seed=1234, max_tokens=12, ignore_eos=True
    )
    a = llm.generate([prompt, prompt], [sampled, sampled])
    assert a[0].outputs[0].token_ids == a[1].outputs[0].token_ids  # same seed, batched together
    b = llm.generate(prompt, SamplingParams(temperature=1.0, seed=99, max_tokens=12, ignore_eos=True))
    assert b[0].outputs[0].token_ids != a[0].outputs[0].token_ids
    top1 = llm.generate(
        prompt, SamplingParams(temperature=0.8, top_k=1, seed=5, max_tokens=12, ignore_eos=True)
    )
    assert top1[0].outputs[0].token_ids == llm.generate(prompt, GREEDY)[0].outputs[0].token_ids


def test_n_samples_and_logprobs(checkpoint):
    hf, path = checkpoint
    llm = _llm(path)
    prompt = [8, 16, 32, 64]
    out = llm.generate(
        {"prompt_token_ids": prompt},
        SamplingParams(n=3, temperature=1.0, seed=7, max_tokens=5, ignore_eos=True),
    )[0]
    assert [o.index for o in out.outputs] == [0, 1, 2] and len({tuple(o.token_ids) for o in out.outputs}) > 1
    greedy = llm.generate(
        {"prompt_token_ids": prompt}, SamplingParams(temperature=0, max_tokens=1, logprobs=3)
    )[0]
    first = greedy.outputs[0]
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([prompt])).logits[0, -1], -1)
    token = first.token_ids[0]
    assert set(first.logprobs[0]) == set(ref.topk(3).indices.tolist()) | {token}
    assert first.logprobs[0][token] == pytest.approx(ref[token].item(), abs=1e-4)


def test_stop_strings_with_a_tokenizer(atom_cache):
    llm = LLM(
        None, kernel_backend="torch", block_size=4, num_kv_blocks=64
    )  # the built-in demo (has a tokenizer)
    full = llm.generate("The quick brown fox", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))[
        0
    ]
    text = full.outputs[0].text
    assert len(text) > 4
    stop = text[2:4]
    cut = llm.generate(
        "The quick brown fox", SamplingParams(temperature=0, max_tokens=20, ignore_eos=True, stop=[stop])
    )[0].outputs[0]
    assert cut.finish_reason == "stop" and cut.text == text[: text.find(stop)]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(temperature=-1), "temperature"),
        (dict(top_p=0), "top_p"),
        (dict(top_k=0), "top_k"),
        (dict(max_tokens=0), "max_tokens"),
        (dict(n=0), "n must"),
        (dict(min_p=2), "min_p"),
    ],
)
def test_bad_sampling_params_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        SamplingParams(**kwargs)


def test_bad_requests_are_refused_and_the_engine_keeps_serving(checkpoint):
    _, path = checkpoint
    llm = _llm(path, max_model_len=32)
    with pytest.raises(ValueError, match="exceeds the model's max_model_len 32"):
        llm.generate({"prompt_token_ids": list(range(1, 30))}, SamplingParams(max_tokens=10))
    with pytest.raises(ValueError, match=r"must be integers in \[0, 151\)"):
        llm.generate({"prompt_token_ids": [1, 500]})
    with pytest.raises(ValueError, match="no tokenizer"):
        llm.generate("text needs a tokenizer")
    assert llm.generate({"prompt_token_ids": [1, 2, 3]}, GREEDY)[0].finished


def test_demo_model_is_the_default(atom_cache):
    out = LLM(kernel_backend="torch", num_kv_blocks=32).generate(
        "Paged attention", SamplingParams(max_tokens=4)
    )
    assert out[0].finished and len(out[0].outputs[0].token_ids) >= 1
    assert ensure_demo_checkpoint(log=lambda _: None).is_dir()


def test_tensor_parallel_2_over_gloo_equals_1(checkpoint):
    _, path = checkpoint
    prompts = [{"prompt_token_ids": p} for p in _prompts()]
    # On the CPU everywhere (gloo); on a machine with GPUs, TP=2 would need two of them.
    one = _llm(path, device="cpu")
    single = [o.outputs[0].token_ids for o in one.generate(prompts, GREEDY)]
    scoring = dataclasses.replace(GREEDY, prompt_logprobs=2)  # every rank computes the prompt's logits
    scored = one.generate(prompts[:1], scoring)[0].prompt_logprobs
    one.shutdown()
    # async scheduling (as on GPUs by default): the workers feed each step their own last argmax
    tp = _llm(path, tensor_parallel_size=2, device="cpu", async_scheduling=True)
    try:
        assert [o.outputs[0].token_ids for o in tp.generate(prompts, GREEDY)] == single
        assert tp.engine.stats.num_async_steps > 0
        tp_scored = tp.generate(prompts[:1], scoring)[0].prompt_logprobs  # (a synchronous step)
        assert tp_scored[0] is None and [list(e) for e in tp_scored[1:]] == [list(e) for e in scored[1:]]
        for got, expected in zip(tp_scored[1:], scored[1:], strict=True):
            assert list(got.values()) == pytest.approx(list(expected.values()), abs=1e-4)
        workers = tp.engine.runner.workers
        assert len(workers) == 1 and workers[0].is_alive()
        for pid in (os.getpid(), workers[0].pid):  # the rendezvous and gloo listen on loopback only
            addresses = _listening_addresses(pid)
            assert addresses and all(a.startswith("127.") for a in addresses), addresses
    finally:
        tp.shutdown()
    assert not workers[0].is_alive()


def _listening_addresses(pid: int) -> list[str]:
    """The local IPv4/IPv6 addresses of the TCP sockets process `pid` listens on (from /proc)."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    found = []
    for table, width in (("tcp", 8), ("tcp6", 32)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                raw = fields[1].split(":")[0]
                if width == 8:
                    found.append(".".join(str(b) for b in reversed(bytes.fromhex(raw))))
                else:
                    words = [bytes.fromhex(raw[i : i + 8])[::-1] for i in range(0, 32, 8)]
                    addr = ipaddress.IPv6Address(b"".join(words))
                    found.append(str(addr.ipv4_mapped or addr))
    return found


def test_a_cache_smaller_than_the_models_context_lowers_max_model_len(checkpoint):
    _, path = checkpoint  # max_position_embeddings 256; 4 blocks of 16 hold 64 tokens
    llm = _llm(path, block_size=16, num_kv_blocks=4)
    assert llm.engine.max_model_len == 64
    with pytest.raises(ValueError, match="max_model_len 64"):
        llm.generate({"prompt_token_ids": list(range(1, 67))}, SamplingParams(max_tokens=1))
    assert llm.generate({"prompt_token_ids": list(range(1, 50))}, GREEDY)[0].finished  # 49 + 12 fit


@pytest.mark.multi_gpu(reason="tensor parallel on GPUs needs two of them")
@pytest.mark.parametrize("peer_all_reduce", [True, False])
def test_tensor_parallel_2_on_two_gpus_equals_1(checkpoint, peer_all_reduce):
    """fp32, Triton kernels, CUDA graphs for decode; the layers' all-reduces over peer memory (captured in
    the graphs: each fused with the residual add and RMSNorm after it), or NCCL for all; step inputs
    through shared memory."""
    _, path = checkpoint
    prompts = [{"prompt_token_ids": p} for p in _prompts()]
    kw = dict(device="cuda", kernel_backend="triton", block_size=16, num_kv_blocks=64)
    single = [o.outputs[0].token_ids for o in _llm(path, **kw).generate(prompts, GREEDY)]
    for second in (False, True):  # the second engine starts after the first one's shutdown, same process
        tp = _llm(path, tensor_parallel_size=2, disable_custom_all_reduce=not peer_all_reduce, **kw)
        workers = tp.engine.runner.workers
        try:
            assert [o.outputs[0].token_ids for o in tp.generate(prompts, GREEDY)] == single
            assert tp.engine.runner.runner.graphs.decode.replays > 0
            # a process sets up peer memory once (engine/execution/peer_all_reduce.py): its second engine uses NCCL
            peer = tp.engine.runner.runner.parallel.peer_all_reduce
            assert (peer is not None) == (peer_all_reduce and not second)
            if peer is not None:  # the layers' norms summed their inputs themselves (the fused kernel)
                assert int(peer.fused_counts[0]) > 0
        finally:
            tp.shutdown()
        assert not workers[0].is_alive()


def test_tensor_parallel_beyond_the_visible_gpus_is_refused(checkpoint):
    _, path = checkpoint
    visible = torch.cuda.device_count()
    size = max(2, visible + 1)
    # (with none visible, the device itself is refused first, by name)
    words = f"needs {size} GPUs, {visible} are visible" if visible else "sees no CUDA GPU here"
    with pytest.raises(ValueError, match=words):
        _llm(path, tensor_parallel_size=size, device="cuda")
