"""A checkpoint that answers in the harmony format's tokens, for the server's GPT-OSS paths without GPT-OSS.

Built from the demo checkpoint: its tokenizer gains harmony's markers as special tokens and a chat template
of our own that renders messages as harmony does (and a reasoning effort as a system line) and leaves the prompt in the assistant's header
(`<|start|>assistant`); the model's vocabulary grows to hold them. Its weights are edited so that greedy
decoding is known wherever a grammar leaves a choice: dimension 0 of the residual stream is 1 for every
token and nothing writes it, the final norm keeps only that dimension, and the head scores 1 for a few
tokens (FAVOURED) and 0 for every other one. So where a grammar allows one of them, that one is drawn
(after `<|channel|>`, "c" of commentary or "f" of final rather than analysis; `<|end|>` ending a reasoning
message at once); elsewhere the lowest id the grammar allows.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from atom_core.entrypoints.openai.harmony import MARKERS

VOCAB = 528  # the demo's 512 and the 7 markers, rounded up
FAVOURED = ("c", "f", "<|end|>")
TEMPLATE = (
    "{%- if reasoning_effort is defined -%}<|start|>system<|message|>Reasoning: {{ reasoning_effort }}<|end|>"
    "{%- endif -%}"
    "{%- for m in messages -%}<|start|>{{ m.role }}<|message|>{{ m.content or '' }}<|end|>{%- endfor -%}"
    "{%- if tools -%}<|start|>developer<|message|>{{ tools | tojson }}<|end|>{%- endif -%}"
    "{%- if add_generation_prompt -%}<|start|>assistant{%- endif -%}"
)


def harmony_checkpoint(demo: Path, dst: Path) -> Path:
    """The demo checkpoint at `demo`, made a harmony one at `dst` (see above); returns dst."""
    dst.mkdir(parents=True, exist_ok=True)
    tokenizer = AutoTokenizer.from_pretrained(demo)
    tokenizer.add_special_tokens({"additional_special_tokens": list(MARKERS)})
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(dst)
    (dst / "chat_template.jinja").write_text(TEMPLATE)

    config = json.loads((demo / "config.json").read_text())
    config["vocab_size"] = VOCAB
    (dst / "config.json").write_text(json.dumps(config))
    generation = json.loads((demo / "generation_config.json").read_text())
    stops = [tokenizer.convert_tokens_to_ids(m) for m in ("<|return|>", "<|call|>")]
    generation["eos_token_id"] = [generation["eos_token_id"], *stops]
    (dst / "generation_config.json").write_text(json.dumps(generation))

    weights = load_file(demo / "model.safetensors")
    hidden = weights["model.norm.weight"].numel()
    gen = torch.Generator().manual_seed(0)
    embed = torch.cat(
        [weights["model.embed_tokens.weight"], 0.02 * torch.randn(VOCAB - 512, hidden, generator=gen)]
    )
    embed[:, 0] = 1.0
    weights["model.embed_tokens.weight"] = embed
    for name, w in weights.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            w[0] = 0.0  # nothing writes dimension 0
    weights["model.norm.weight"] = torch.nn.functional.one_hot(torch.tensor(0), hidden).float()
    head = torch.zeros(VOCAB, hidden)
    for token in FAVOURED:
        head[tokenizer.convert_tokens_to_ids(token), 0] = 1.0
    weights["lm_head.weight"] = head
    save_file({k: v.contiguous() for k, v in weights.items()}, dst / "model.safetensors")
    return dst
