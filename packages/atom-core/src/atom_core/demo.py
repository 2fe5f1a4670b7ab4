"""The built-in demo checkpoint: a tiny Llama with random weights and a locally trained tokenizer.

No model hub is needed: it is made on first use in the user cache, deterministically (fixed seed), and
its output is random text. It is a real checkpoint on disk (config.json, safetensors, tokenizer.json).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

DEMO_NAME = "demo-llama-v1"
DEMO_SEED = 0

# Short original text for the tokenizer's merges; the model is random, so any text would do.
_CORPUS = [
    "An inference engine turns a prompt into tokens, runs the model over them, and samples the next token.",
    "Paged attention keeps the key and value cache in fixed-size blocks, so sequences grow without copying.",
    "Continuous batching lets new requests join a running batch at every step instead of waiting for it.",
    "A prefix cache shares the blocks of a common prompt between requests that start the same way.",
    "Tensor parallel splits every weight matrix across devices and joins the partial results with a sum.",
    "The quick brown fox jumps over the lazy dog while the slow green turtle naps in the warm sun.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 and symbols like + - * / = ( ) [ ] { } . , ; : ! ?",
]

_CHAT_TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|>\n{{ m['content'] }}</s>\n{% endfor %}"
    "{% if add_generation_prompt %}<|assistant|>\n{% endif %}"
)


def cache_root() -> Path:
    """$ATOM_CACHE_DIR, else $XDG_CACHE_HOME/atom, else ~/.cache/atom."""
    if explicit := os.environ.get("ATOM_CACHE_DIR"):
        return Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "atom"


def demo_checkpoint_dir() -> Path:
    return cache_root() / DEMO_NAME


def _train_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_CORPUS, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>")
    fast.chat_template = _CHAT_TEMPLATE
    return fast


def _write_checkpoint(path: Path) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    tokenizer = _train_tokenizer(vocab_size=512)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        tie_word_embeddings=False,
    )
    torch.manual_seed(DEMO_SEED)
    model = LlamaForCausalLM(config)
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / "ATOM_DEMO.txt").write_text(
        "ATOM's built-in demo checkpoint: a tiny Llama with RANDOM weights. Its output is meaningless.\n"
    )


def ensure_demo_checkpoint(log=print) -> Path:
    """Return the demo checkpoint dir, creating it on first use (atomically: a rename into place)."""
    target = demo_checkpoint_dir()
    if (target / "config.json").exists() and (target / "tokenizer.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    log(f"creating the built-in demo checkpoint in {target} (random weights, local tokenizer)")
    staging = Path(tempfile.mkdtemp(prefix=f".{DEMO_NAME}-", dir=target.parent))
    try:
        _write_checkpoint(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # not a concurrent creator winning the race
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target
