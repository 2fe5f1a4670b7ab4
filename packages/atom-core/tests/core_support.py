"""What atom-core's tests share: tiny configs, random checkpoints, transformers' greedy reference, free ports.

pytest imports test files with --import-mode=importlib, so conftest.py puts this directory on sys.path and
tests import this module as `core_support`; worker processes a test spawns inherit that sys.path.
The fixtures built on these (tiny_llama, hf_greedy_tokens, a_free_port) are in conftest.py.
"""

import socket
from pathlib import Path

import torch

# A tiny Llama-shaped config, the base the tests' own configs override (fp32 on the CPU in seconds).
TINY = dict(
    vocab_size=211,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)
# The model behind the tiny_llama fixture (engine, server and CLI tests).
TINY_LLAMA = dict(TINY, vocab_size=151)


def random_checkpoint(config, path: Path, *, seed: int = 0, max_shard_size=None, dtype=None):
    """transformers' model of `config` (any model config) with random weights drawn after
    torch.manual_seed(seed), saved to `path` (in shards of at most `max_shard_size` if given).
    Returns (the model in eval mode, path)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, **({} if dtype is None else {"dtype": dtype})).eval()
    model.save_pretrained(path, **({} if max_shard_size is None else {"max_shard_size": max_shard_size}))
    return model, path


def hf_greedy(model, prompt, steps):
    """Plain argmax decoding with transformers' own KV cache (no logits processors: generate() would, e.g.,
    suppress EOS under min_new_tokens)."""
    tokens, past = list(prompt), None
    with torch.no_grad():
        step_input = torch.tensor([prompt])
        for _ in range(steps):
            out = model(step_input, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
            step_input = torch.tensor([[tokens[-1]]])
    return tokens[len(prompt) :]


def free_port() -> int:
    """A localhost TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
