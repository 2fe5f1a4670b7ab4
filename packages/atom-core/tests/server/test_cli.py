import json
import re
import subprocess
import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from atom_core.cli import main
from atom_core.demo import demo_checkpoint_dir


def _greedy(model, ids, steps, eos):
    """An independent greedy loop: full forward each step, argmax of the last logits."""
    out = list(ids)
    for _ in range(steps):
        with torch.no_grad():
            logits = model(torch.tensor([out])).logits[0, -1]
        out.append(int(logits.argmax()))
        if out[-1] == eos:
            break
    return out[len(ids) :]


def test_generate_on_the_demo_model_from_an_empty_cache(atom_cache, capsys):
    assert main(["generate", "--json", "--max-tokens", "6", "--prompt", "The quick brown fox"]) == 0
    captured = capsys.readouterr()
    assert "RANDOM weights" in captured.err
    record = json.loads(captured.out.strip().splitlines()[-1])

    path = demo_checkpoint_dir()
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    assert record["prompt_token_ids"] == tokenizer("The quick brown fox").input_ids
    expected = _greedy(model, record["prompt_token_ids"], 6, tokenizer.eos_token_id)
    assert record["token_ids"] == expected
    assert record["text"] == tokenizer.decode(expected, skip_special_tokens=True)


def test_generate_from_token_ids(atom_cache, capsys):
    assert main(["generate", "--json", "--max-tokens", "3", "--prompt-token-ids", "0,5,9,17"]) == 0
    record = json.loads(capsys.readouterr().out.strip())
    assert record["prompt"] is None and record["prompt_token_ids"] == [0, 5, 9, 17]
    assert 1 <= len(record["token_ids"]) <= 3


def test_generate_takes_prompts_as_positional_arguments(atom_cache, capsys):
    """As vLLM users type it: `atom generate "a prompt" "another"`, beside --prompt and token ids, in order."""
    args = ["generate", "--json", "--max-tokens", "3", "Paged attention", "The quick brown fox"]
    assert main([*args, "--prompt", "Hello there", "--prompt-token-ids", "0,5,9"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [r["prompt"] for r in records] == ["Paged attention", "The quick brown fox", "Hello there", None]
    assert records[3]["prompt_token_ids"] == [0, 5, 9]


def test_bad_arguments_are_refused(atom_cache, tmp_path, capsys):
    assert main(["generate", "--max-tokens", "0"]) == 2
    assert main(["generate", "--model", str(tmp_path)]) == 2
    assert "not a checkpoint dir" in capsys.readouterr().err


def test_console_script_reports_versions():
    out = subprocess.run(
        [sys.executable, "-m", "atom_core.cli", "--version"], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("atom-core 0.1.0, atom-kernels 0.1.0")


def test_bad_sampling_flags_exit_2_with_the_reason(atom_cache, capsys):
    assert main(["generate", "--temperature", "-1"]) == 2
    assert "temperature must be >= 0" in capsys.readouterr().err


def test_bench_reports_throughput_and_latency(atom_cache, capsys):
    assert (
        main(
            [
                "bench",
                "--num-prompts",
                "5",
                "--input-len",
                "9",
                "--output-len",
                "4",
                "--json",
                "--num-kv-blocks",
                "64",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert result["num_prompts"] == 5 and result["output_tokens"] == 20
    assert result["output_tok_s"] > 0 and result["latency_ms_p90"] >= result["latency_ms_p50"] > 0
    assert "5/5 requests done" in captured.err and "20/20" in captured.err  # the bar counts tokens
    assert (
        main(
            ["bench", "--num-prompts", "2", "--input-len", "3", "--output-len", "2", "--num-kv-blocks", "16"]
        )
        == 0
    )
    assert "output throughput" in capsys.readouterr().out


def test_bench_with_arrivals_and_sampling_reports_the_steps_that_overlapped(atom_cache, capsys):
    """--request-rate: requests arrive as a Poisson process and prefill beside running decodes; with async
    scheduling and sampled requests every step but the first of each busy period overlaps the last."""
    argv = ["bench", "--num-prompts", "6", "--input-len", "9", "--output-len", "5", "--num-kv-blocks", "64"]
    sampled = ["--temperature", "0.8", "--top-p", "0.95", "--seed", "3", "--async-scheduling", "--json"]
    assert main([*argv, "--request-rate", "40", *sampled]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["request_rate"] == 40 and result["output_tokens"] == 30
    assert 0 < result["overlapped_steps"] < result["steps"]
    assert main([*argv, "--request-rate", "0"]) == 2
    assert "--request-rate must be positive, got 0.0" in capsys.readouterr().err
    assert main([*argv, "--top-p", "0"]) == 2
    assert "top_p must be in (0, 1]" in capsys.readouterr().err


def test_bench_draws_each_requests_lengths_around_the_asked_ones(atom_cache, capsys):
    """--random-range-ratio 0.5: lengths uniform in [len/2, 3 len/2], each output exactly its own; the
    progress bar moves by tokens as steps make them."""
    argv = ["bench", "--num-prompts", "12", "--input-len", "10", "--output-len", "6", "--num-kv-blocks", "96"]
    assert main([*argv, "--random-range-ratio", "0.5", "--json"]) == 0
    captured = capsys.readouterr()
    result = json.loads(captured.out.strip().splitlines()[-1])
    assert 12 * 3 <= result["output_tokens"] <= 12 * 9 and result["output_tokens"] != 12 * 6
    assert 12 * 5 <= result["input_tokens"] <= 12 * 15 and result["input_tokens"] != 12 * 10
    assert result["range_ratio"] == 0.5
    ticks = re.findall(r"(\d+)/(\d+) \[", captured.err)  # tqdm's "made/total [" at each refresh
    assert ticks[-1] == (str(result["output_tokens"]),) * 2, captured.err
    assert main([*argv, "--random-range-ratio", "1"]) == 2
    assert "error: --random-range-ratio must be in [0, 1), got 1.0" in capsys.readouterr().err


def test_generate_with_tensor_parallel_2_equals_1(atom_cache, capsys):
    args = [
        "generate",
        "--json",
        "--max-tokens",
        "5",
        "--ignore-eos",
        "--prompt",
        "The quick brown fox",
        "--device",
        "cpu",
    ]
    assert main(args) == 0
    single = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main([*args, "--tensor-parallel-size", "2"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["token_ids"] == single["token_ids"]


ENGINE_OPTIONS = {  # every engine option, each away from its default
    "--model": "/ckpt",
    "--dtype": "bfloat16",
    "--load-format": "dummy",
    "--max-model-len": "99",
    "--tensor-parallel-size": "2",
    "--block-size": "32",
    "--num-kv-blocks": "7",
    "--kv-cache-dtype": "fp8",
    "--kv-layout": "shuffle",
    "--max-num-seqs": "5",
    "--max-num-batched-tokens": "333",
    "--device": "cpu",
    "--kernel-backend": "torch",
    "--gpu-memory-utilization": "0.5",
    "--speculative-config": '{"method": "mtp", "num_speculative_tokens": 2}',
    "--state-snapshots": "3",
    "--max-prefill-graph-tokens": "256",
    "--state-cache-dtype": "bfloat16",
    "--generation-config": "vllm",
    "--tokenizer": "/tok",
    "--chat-template": "{{ messages }}",
    "--seed": "5",
}
ENGINE_FLAGS = [
    *(part for pair in ENGINE_OPTIONS.items() for part in pair),
    "--enforce-eager",
    "--disable-custom-all-reduce",
    "--no-async-scheduling",
    "--no-enable-prefix-caching",
]


def test_generate_serve_and_bench_accept_every_engine_option_alike():
    from dataclasses import fields

    from atom_core.cli import build_parser
    from atom_core.engine import EngineConfig

    parser = build_parser()
    configs = {
        cmd: EngineConfig.from_cli_args(parser.parse_args([cmd, *ENGINE_FLAGS]))
        for cmd in ("generate", "serve", "bench")
    }
    assert configs["generate"] == configs["serve"] == configs["bench"]
    defaults = EngineConfig()
    assert all(getattr(configs["serve"], f.name) != getattr(defaults, f.name) for f in fields(EngineConfig))
    for cmd in ("generate", "serve", "bench"):  # and with no flags, the dataclass's defaults
        assert EngineConfig.from_cli_args(parser.parse_args([cmd])) == defaults
