"""What atom-vllm's tests share: tiny configs of every architecture ATOM serves, random checkpoints with a
tokenizer trained here (no model hub), transformers' references (greedy tokens, attention windows), and
free localhost ports.

pytest imports test files with --import-mode=importlib, so conftest.py puts this directory on sys.path and
tests import this module as `vllm_support`. The fixtures built on it are in e2e_cpu/conftest.py.
"""

import logging
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch

from tools.testing_models import (  # noqa: F401 (re-exported)
    DEEPSEEK_V2_TINY,
    DEEPSEEK_V3_TINY,
    TINY_ARCHITECTURES,
    TINY_DIMS,
    config_class_name,
    free_port,
    random_checkpoint,
)
from tools.testing_seams import record_steps

# Every MHA architecture's tiny model (tools/testing_models.py; the vocabulary is the trained tokenizer's).
# head_dim 32 everywhere: vLLM's own CPU attention (run with ATOM off) supports 32/64/80/96/112/128/256,
# so Llama takes two heads of 32 over one KV head.
TINY = dict(TINY_DIMS, bos_token_id=0, eos_token_id=1)
ARCHITECTURES = {
    name: TINY_ARCHITECTURES[name]
    for name in (
        "LlamaForCausalLM",
        "Qwen3ForCausalLM",
        "Qwen3MoeForCausalLM",
        "Qwen2MoeForCausalLM",
        "MixtralForCausalLM",
        "Glm4MoeForCausalLM",
        "Gemma3ForCausalLM",
        "GptOssForCausalLM",
    )
}
ARCHITECTURES["LlamaForCausalLM"] = dict(num_attention_heads=2, num_key_value_heads=1)

STEPS = 8

# Ragged prompts; the third shares its first 32 tokens (two 16-token pages) with the first.
PROMPTS = [
    [(7 * i + 3) % 290 + 2 for i in range(40)],
    [5, 17, 42, 9, 100],
    [(7 * i + 3) % 290 + 2 for i in range(32)] + [11, 12, 13, 14, 15, 16, 17],
]


# The KV cache every test engine gets: thousands of pages for these tiny models. Sized explicitly because
# vLLM's CPU worker otherwise sizes it as 10% of memory less its own process's size, which is negative
# when the engine runs in the test's process (e2e_cpu/conftest.py).
KV_CACHE_BYTES = 64 << 20


def run_vllm(path, prompts, *, rounds=1, block_size=16, dtype="float32", probe=None, **llm_kwargs):
    """(greedy tokens per round, what the worker built, prefix-cache hits in tokens). llm_kwargs override
    LLM(...)'s arguments below; probe(llm), if given, runs after the rounds on the same engine."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    # A 24-token step budget: the 40-token prompt prefills in chunks (24, then 16 beside the 5-token one).
    options = dict(
        dtype=dtype,
        max_model_len=128,
        enforce_eager=True,
        max_num_seqs=4,
        block_size=block_size,
        max_num_batched_tokens=24,
        enable_prefix_caching=True,
        gpu_memory_utilization=0.1,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        disable_log_stats=False,
    )
    llm = LLM(model=str(path), **{**options, **llm_kwargs})
    params = SamplingParams(temperature=0, max_tokens=STEPS, ignore_eos=True, detokenize=False)
    runs = []
    for _ in range(rounds):  # a second round finds the prompts' pages in the prefix cache
        out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
        runs.append([list(o.outputs[0].token_ids) for o in out])
    if probe is not None:
        probe(llm)
    from atom_vllm.diagnostics import describe

    (what,) = llm.apply_model(describe)  # one worker
    hits = sum(m.value for m in llm.get_metrics() if m.name == "vllm:prefix_cache_hits")
    return runs, what, hits


# What reached atom-core's step functions in the worker (tools/testing_seams.py): record_core_steps
# wraps them there before the prompts run, core_steps reads the counts; both through LLM.apply_model.
CORE_STEPS: Counter = Counter()


def record_core_steps(model) -> None:
    import atom_vllm.attention.gdn as gdn
    import atom_vllm.attention.mla as mla

    record_steps([gdn, mla], CORE_STEPS)


def core_steps(model) -> dict[str, int]:
    return dict(CORE_STEPS)


def speculate(path, prompts, steps: int, *, before=None, **llm_kwargs):
    """Greedy tokens of prompts from LLM(path) with ATOM's MTP draft proposing k = 2 tokens a step ->
    (tokens per prompt, drafted tokens, accepted tokens, the LLM). before: run in the worker
    (LLM.apply_model) before the prompts. llm_kwargs override LLM(...)'s arguments below."""
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    options = dict(
        dtype="float32",
        max_model_len=128,
        enforce_eager=True,
        max_num_seqs=4,
        gpu_memory_utilization=0.1,
        kv_cache_memory_bytes=KV_CACHE_BYTES,
        disable_log_stats=False,
        speculative_config={"method": "mtp", "num_speculative_tokens": 2},
    )
    llm = LLM(model=str(path), **{**options, **llm_kwargs})
    if before is not None:
        llm.apply_model(before)
    params = SamplingParams(temperature=0, max_tokens=steps, ignore_eos=True, detokenize=False)
    out = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False)
    counters = ("vllm:spec_decode_num_draft_tokens", "vllm:spec_decode_num_accepted_tokens")
    metrics = {m.name: m.value for m in llm.get_metrics() if m.name in counters}
    drafted, accepted = (metrics[name] for name in counters)
    return [list(o.outputs[0].token_ids) for o in out], drafted, accepted, llm


@contextmanager
def recorded_lines(logger: logging.Logger, level: int) -> Iterator[list[str]]:
    """The messages `logger` logs at `level` and above while the block runs, taken at the logger itself
    (whatever handlers, levels and streams the process's logging has)."""
    lines: list[str] = []
    handler = logging.Handler(level)
    handler.emit = lambda record: lines.append(record.getMessage())
    old_level = logger.level
    if logger.getEffectiveLevel() > level:
        logger.setLevel(level)
    logger.addHandler(handler)
    try:
        yield lines
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)


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
    """A random tiny `architecture` (TINY and config_kwargs) with the trained tokenizer, saved to `path`."""
    import transformers

    tokenizer = train_tokenizer()
    config = getattr(transformers, config_class_name(architecture))(
        **{"vocab_size": len(tokenizer), **TINY, **config_kwargs}
    )
    random_checkpoint(config, path)
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


# DeepSeek-V3 and V2 (MLA + DeepSeek MoE) run under vLLM with ATOM's own MLA layer; latent widths other
# than vLLM's 320/512/576 (here 32 + 16) work as well. vLLM's CPU platform forces 16-token pages and turns
# chunked prefill and prefix caching off for MLA model types.
MLA_ARCHITECTURES = {"DeepseekV3ForCausalLM": DEEPSEEK_V3_TINY, "DeepseekV2ForCausalLM": DEEPSEEK_V2_TINY}


MTP_TARGETS = {  # the targets whose checkpoints carry an MTP layer: their configs' tiny fields
    "DeepseekV3ForCausalLM": ("DeepseekV3Config", DEEPSEEK_V3_TINY),
    "Glm4MoeForCausalLM": ("Glm4MoeConfig", TINY_ARCHITECTURES["Glm4MoeForCausalLM"]),
}


def save_mtp_checkpoint(
    path: Path, *, layers: int = 2, architecture: str = "DeepseekV3ForCausalLM"
) -> Checkpoint:
    """A random tiny DeepSeek-V3 (or another of MTP_TARGETS) with one MTP layer saved as the published
    checkpoints are: transformers' model with layers + 1 decoder layers, the last one becoming the MTP layer
    (model.layers.{layers}.*, num_nextn_predict_layers 1) with its enorm, hnorm, eh_proj and shared_head.
    The MTP layer "echoes":
    eh_proj passes hnorm(h) through, its attention and MLP outputs are zero and shared_head.norm is the
    target's final norm, so it proposes the token the target just predicted again, which the target
    accepts wherever its greedy output repeats a token (random tiny models do, often)."""
    import json

    import transformers
    from safetensors.torch import load_file, save_file

    tokenizer = train_tokenizer()
    config_class, tiny = MTP_TARGETS[architecture]
    fields = {"vocab_size": len(tokenizer), **TINY, **tiny, "num_hidden_layers": layers + 1}
    random_checkpoint(getattr(transformers, config_class)(**fields), path)
    tensors = load_file(path / "model.safetensors")
    hidden, mtp = fields["hidden_size"], f"model.layers.{layers}"
    tensors[f"{mtp}.enorm.weight"] = torch.ones(hidden)
    tensors[f"{mtp}.hnorm.weight"] = torch.ones(hidden)
    tensors[f"{mtp}.eh_proj.weight"] = torch.cat([torch.zeros(hidden, hidden), torch.eye(hidden)], dim=1)
    tensors[f"{mtp}.shared_head.norm.weight"] = tensors["model.norm.weight"].clone()
    for name in tensors:
        if name.startswith(mtp) and name.endswith(("o_proj.weight", "down_proj.weight")):
            tensors[name] = torch.zeros_like(tensors[name])
    save_file(tensors, path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((path / "config.json").read_text())
    config.update(num_hidden_layers=layers, num_nextn_predict_layers=1)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    tokenizer.save_pretrained(path)
    return Checkpoint(architecture, path)


# Qwen3-Next and Qwen3.5 (Gated DeltaNet beside gated full attention) run under vLLM with ATOM's own GDN
# layer over vLLM's state cache: tools/testing_qwen.py's tiny cases (16-wide key heads: vLLM's own CPU GDN
# kernels refuse them, and need bf16; ATOM's run fp32).
HYBRID_CASES = {
    "qwen3-next": "Qwen3NextForCausalLM",
    "qwen3.5": "Qwen3_5ForCausalLM",
    "qwen3.5-moe": "Qwen3_5MoeForCausalLM",
    "qwen3.5-conditional-generation": "Qwen3_5ForConditionalGeneration",
}


def save_hybrid_checkpoint(case: str, path: Path, *, mtp_train_steps: int | None = None, **overrides):
    """tools/testing_qwen.py's tiny `case` (config overrides applied) over the trained tokenizer's
    vocabulary, with the tokenizer; with mtp_train_steps, an MTP layer too (trained with the target for
    that many steps). Returns (Checkpoint, transformers' model of the target)."""
    from tools.testing_qwen import qwen3_next_checkpoint, qwen_mtp_checkpoint

    tokenizer = train_tokenizer()
    if mtp_train_steps is None:
        model = qwen3_next_checkpoint(path, case, vocab_size=len(tokenizer), **overrides)
    else:
        model, _ = qwen_mtp_checkpoint(
            path, case, train_steps=mtp_train_steps, vocab_size=len(tokenizer), **overrides
        )
    tokenizer.save_pretrained(path)
    return Checkpoint(HYBRID_CASES[case], path), model


def greedy_by_recompute(model, prompt: list[int], steps: int) -> list[int]:
    """transformers' greedy continuation, the whole sequence recomputed each step (any model class)."""
    tokens = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            tokens.append(int(model(torch.tensor([tokens])).logits[0, -1].argmax()))
    return tokens[len(prompt) :]


def assert_fp16_greedy(
    reference: Path, prompts: list[list[int]], runs: list[list[int]], *, near_tie: float = 5e-3
) -> None:
    """Every greedy token vLLM picked in fp16 is transformers' argmax (fp32, the checkpoint at `reference`,
    teacher-forced on vLLM's own tokens) up to fp16's rounding of near-ties (logits within near_tie of the
    largest, relative to the row's range; bf16's rounding is 8 times coarser), and 90% are exactly it."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(reference, dtype=torch.float32).eval()
    exact = 0
    for prompt, tokens in zip(prompts, runs, strict=True):
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1]
        for row, token in zip(logits, tokens, strict=True):
            assert row[token] >= row.max() - near_tie * row.abs().max(), "a token fp16 noise cannot explain"
            exact += int(row.argmax()) == token
    assert exact >= 0.9 * sum(len(tokens) for tokens in runs)
