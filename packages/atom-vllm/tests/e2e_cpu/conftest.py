"""Tiny random checkpoints saved by transformers, with a tokenizer trained here (no model hub), and
transformers' own greedy continuations as the ground truth."""

from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Paged attention keeps the KV cache in fixed-size blocks.",
    "vLLM and ATOM agree on every greedy token, or the test fails.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 11 12 and some punctuation!?",
]


@dataclass(frozen=True)
class Checkpoint:
    architecture: str
    path: Path


def train_tokenizer():
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(
        CORPUS,
        trainers.BpeTrainer(
            vocab_size=300,
            special_tokens=["<s>", "</s>"],
            show_progress=False,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        ),
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 0)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")


def save_checkpoint(architecture: str, path: Path, config_kwargs: dict) -> Checkpoint:
    import transformers

    tokenizer = train_tokenizer()
    family = architecture.removesuffix("ForCausalLM")
    config = getattr(transformers, f"{family}Config")(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=1,
        **config_kwargs,
    )
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(config).eval()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return Checkpoint(architecture, path)


def transformers_windows(path: Path) -> list[int | None]:
    """Each layer's attention window in transformers' own model of the checkpoint (None: full)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return [getattr(layer.self_attn, "sliding_window", None) for layer in model.model.layers]


def transformers_greedy(path: Path, prompt: list[int], steps: int) -> list[int]:
    """transformers' greedy continuation, step by step through its own KV cache."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tokens, past, step = list(prompt), None, torch.tensor([prompt])
    with torch.no_grad():
        for _ in range(steps):
            out = model(step, past_key_values=past, use_cache=True)
            past = out.past_key_values
            tokens.append(int(out.logits[0, -1].argmax()))
            step = torch.tensor([[tokens[-1]]])
    return tokens[len(prompt) :]


@pytest.fixture(scope="session")
def checkpoint_for(tmp_path_factory):
    """checkpoint_for(architecture, **config_kwargs): saved once per architecture and config per session."""
    made: dict[str, Checkpoint] = {}

    def get(architecture: str, **config_kwargs) -> Checkpoint:
        key = f"{architecture}{sorted(config_kwargs.items())}"
        if key not in made:
            path = tmp_path_factory.mktemp(architecture) / "ckpt"
            made[key] = save_checkpoint(architecture, path, config_kwargs)
        return made[key]

    return get


@pytest.fixture(scope="session")
def greedy_reference():
    """greedy_reference(checkpoint, prompt, steps) -> transformers' greedy tokens."""
    return lambda ckpt, prompt, steps: transformers_greedy(ckpt.path, prompt, steps)


@pytest.fixture(scope="session")
def windows_reference():
    """windows_reference(checkpoint) -> each layer's window in transformers' model of it."""
    return lambda ckpt: transformers_windows(ckpt.path)
