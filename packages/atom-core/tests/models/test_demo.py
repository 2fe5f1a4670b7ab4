import torch
from safetensors.torch import load_file
from transformers import AutoConfig, AutoTokenizer

from atom_core.demo import DEMO_NAME, ensure_demo_checkpoint


def test_demo_checkpoint_is_created_once_and_is_a_real_checkpoint(atom_cache):
    messages = []
    path = ensure_demo_checkpoint(log=messages.append)
    assert path == atom_cache / DEMO_NAME
    assert len(messages) == 1 and "random weights" in messages[0]

    config = AutoConfig.from_pretrained(path)
    assert config.architectures == ["LlamaForCausalLM"]
    tokenizer = AutoTokenizer.from_pretrained(path)
    assert config.vocab_size == len(tokenizer)
    ids = tokenizer("Paged attention keeps the cache").input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.decode(ids, skip_special_tokens=True) == "Paged attention keeps the cache"
    chat = tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False)
    assert "<|user|>" in chat

    weights = load_file(path / "model.safetensors")
    embed = weights["model.embed_tokens.weight"]
    assert embed.shape == (config.vocab_size, config.hidden_size)
    assert embed.std() > 0  # random, not zeros

    assert ensure_demo_checkpoint(log=messages.append) == path
    assert len(messages) == 1  # reused, not rebuilt


def test_demo_weights_are_deterministic(atom_cache, tmp_path, monkeypatch):
    first = load_file(ensure_demo_checkpoint(log=lambda _: None) / "model.safetensors")
    monkeypatch.setenv("ATOM_CACHE_DIR", str(tmp_path / "second"))
    second = load_file(ensure_demo_checkpoint(log=lambda _: None) / "model.safetensors")
    assert first.keys() == second.keys()
    for name in first:
        torch.testing.assert_close(first[name], second[name], rtol=0, atol=0)
