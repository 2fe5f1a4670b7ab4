"""xgrammar against llguidance (the two grammar engines vLLM offers) on what structured outputs cost the
host: compiling a JSON schema (the first one, which also pays what the library builds once per
vocabulary, then another), and filling one row's token mask per decoding step (a fresh matcher's first
walk, which builds lazily, then the same walk again).

  cd packages/atom-core && ../../.venvs/vllm-cpu/bin/python -m benchmarks run grammar_backends -- \\
      --vocab o200k_base.tiktoken

(vLLM's CPU environment has both libraries at the versions vLLM 0.32 pins.) The vocabulary is a tiktoken
BPE file's first 128,256 tokens (Llama-3's size). A walk of --steps tokens through the schema (each step a
random token among those xgrammar's mask allows, seeded) is replayed through both: each step fills the
mask and accepts the token; per-step times of the second walk are reported as median, p90 and max. Both
run single-threaded here, as one row of a batch would.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import statistics
import time

import torch

from benchmarks.harness.schemas import SCHEMA

VOCAB = 128256
OTHER = {**SCHEMA, "minItems": 150}  # a second schema: compiled with what the first built already


def load_ranks(path: str) -> dict[bytes, int]:
    with open(path, "rb") as f:
        pairs = (line.split() for line in f.read().splitlines())
        return {base64.b64decode(t): int(r) for t, r in pairs if int(r) < VOCAB - 1}


def xgrammar_side(ranks: dict[bytes, int], eos: int):
    import xgrammar as xgr

    vocab = [b"" for _ in range(VOCAB)]
    for token, rank in ranks.items():
        vocab[rank] = token
    vocab[eos] = b"<|eos|>"
    info = xgr.TokenizerInfo(vocab, vocab_type=xgr.VocabType.RAW, vocab_size=VOCAB, stop_token_ids=[eos])
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    compile_ms = []
    for schema in (SCHEMA, OTHER):  # the first also pays what the library builds once per vocabulary
        start = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(schema), max_whitespace_cnt=32)
        compile_ms.append((time.perf_counter() - start) * 1e3)
    compiled = compiler.compile_json_schema(json.dumps(SCHEMA), max_whitespace_cnt=32)
    mask = xgr.allocate_token_bitmask(1, VOCAB)

    def matcher():
        m = xgr.GrammarMatcher(compiled)

        def fill():
            m.fill_next_token_bitmask(mask, 0)
            return mask

        return fill, m.accept_token

    return compile_ms, matcher


def llguidance_side(ranks: dict[bytes, int], eos: int):
    import llguidance
    import llguidance.torch as lt
    import tiktoken
    from llguidance.tiktoken import lltokenizer_from_encoding

    encoding = tiktoken.Encoding(
        "o200k-128k", pat_str=r"\S+|\s+", mergeable_ranks=ranks, special_tokens={"<|eos|>": eos}
    )
    tokenizer = lltokenizer_from_encoding(encoding, n_vocab=VOCAB, eos_token=eos)
    compile_ms = []
    for schema in (SCHEMA, OTHER):
        start = time.perf_counter()
        grammar = llguidance.LLMatcher.grammar_from_json_schema(
            json.dumps(schema), {"whitespace_flexible": True}
        )
        probe = llguidance.LLMatcher(tokenizer, grammar)  # (compiled when the matcher is made)
        compile_ms.append((time.perf_counter() - start) * 1e3)
        assert not probe.is_error(), probe.get_error()
    grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(SCHEMA), {"whitespace_flexible": True})
    mask = lt.allocate_token_bitmask(1, VOCAB)

    def matcher():
        m = llguidance.LLMatcher(tokenizer, grammar)

        def fill():
            lt.fill_next_token_bitmask(m, mask, 0)
            return mask

        return fill, m.consume_token

    return compile_ms, matcher


def allowed(mask: torch.Tensor) -> list[int]:
    bits = (
        mask[0].view(torch.uint8).unpackbits(bitorder="little")
        if hasattr(torch.Tensor, "unpackbits")
        else None
    )
    if bits is None:
        words = mask[0].tolist()
        return [
            w * 32 + b
            for w, word in enumerate(words)
            for b in range(32)
            if (word >> b) & 1 and w * 32 + b < VOCAB
        ]
    return bits.nonzero().flatten().tolist()


def walk(matcher, steps: int, seed: int) -> list[int]:
    """A seeded walk: each step a random allowed token."""
    fill, accept = matcher()
    rng, tokens = random.Random(seed), []
    for _ in range(steps):
        options = allowed(fill())
        token = rng.choice(options)
        assert accept(token)
        tokens.append(token)
    return tokens


def replay(matcher, tokens: list[int]) -> list[float]:
    """Each step's fill and accept, in ms order of the walk (the first includes what a fresh matcher
    builds lazily)."""
    fill, accept = matcher()
    times = []
    for token in tokens:
        start = time.perf_counter()
        fill()
        accept(token)
        times.append(time.perf_counter() - start)
    return times


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--vocab", required=True)
    parser.add_argument("--steps", type=int, default=256)
    args = parser.parse_args()
    torch.set_num_threads(1)
    ranks = load_ranks(args.vocab)
    eos = VOCAB - 1
    sides = {"xgrammar": xgrammar_side(ranks, eos), "llguidance": llguidance_side(ranks, eos)}
    tokens = walk(sides["xgrammar"][1], args.steps, seed=0)
    rows = []
    for name, (compile_ms, matcher) in sides.items():
        first_walk = [t * 1e3 for t in replay(matcher, tokens)]
        times = sorted(t * 1e3 for t in replay(matcher, tokens))
        rows.append(
            dict(
                backend=name,
                compile_ms_first=compile_ms[0],
                compile_ms_another=compile_ms[1],
                first_walk_ms_total=sum(first_walk),
                first_step_ms=first_walk[0],
                fill_accept_ms_median=statistics.median(times),
                fill_accept_ms_p90=times[int(0.9 * len(times))],
                fill_accept_ms_max=times[-1],
                steps=len(times),
            )
        )
        print(json.dumps(rows[-1]), flush=True)
    return dict(vocab=VOCAB, steps=args.steps, rows=rows)


if __name__ == "__main__":
    main()
