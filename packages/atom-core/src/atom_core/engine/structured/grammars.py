"""An engine's grammar compiler (llguidance's, over the checkpoint's tokenizer) with its cache of compiled
grammars, and each sequence's matcher. A grammar is compiled once per distinct constraint, off the
engine's thread and bounded in time, so a grammar can refuse its own request but never stall the others.

llguidance was chosen over xgrammar by measurement (benchmarks/bench_grammar_backends.py): it compiles a
JSON schema in milliseconds where xgrammar takes most of a second for a 128k vocabulary, and fills a
row's mask several times faster; its parser also bounds each step's work, so a grammar that is costly to
walk fails its own request instead of holding the step."""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from threading import Lock

from atom_core.engine.structured.matcher import Matcher
from atom_core.engine.structured.params import StructuredOutputsParams

COMPILE_TIMEOUT_S = 10.0
CACHE_SIZE = 256  # distinct constraints kept compiled (a server's clients tend to reuse a few schemas)
# JSON between its tokens: no free whitespace, so a model can never loop on it; the separators carry the
# one space that Python's json.dumps and most models write
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class Grammars:
    """Built over a checkpoint's tokenizer (for_tokenizer) or a vocabulary llguidance was given directly
    (an llguidance LLTokenizer); vocab_size: the model's logits width (which may pad the tokenizer's)."""

    def __init__(self, tokenizer, vocab_size: int, timeout_s: float = COMPILE_TIMEOUT_S):
        import llguidance

        self.llg, self.tokenizer, self.vocab_size, self.timeout_s = (
            llguidance,
            tokenizer,
            vocab_size,
            timeout_s,
        )
        self._cache: OrderedDict[str, str] = OrderedDict()
        self._lock = Lock()
        # compilation runs here, waited for at most timeout_s: a pathological schema leaves a thread
        # busy, not the caller
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="atom-grammar")

    @classmethod
    def for_tokenizer(cls, tokenizer, vocab_size: int, timeout_s: float = COMPILE_TIMEOUT_S) -> Grammars:
        """tokenizer: the checkpoint's (transformers, fast) tokenizer."""
        import llguidance.hf

        try:
            vocabulary = llguidance.hf.from_tokenizer(tokenizer, n_vocab=vocab_size)
        except ValueError as err:  # llguidance reads fast (Rust) tokenizers only
            raise ValueError(f"structured outputs need a fast tokenizer: {err}") from None
        return cls(vocabulary, vocab_size, timeout_s)

    def compile(self, spec: StructuredOutputsParams) -> str:
        """spec's grammar, compiled and checked against the vocabulary (llguidance's grammar text);
        ValueError naming what is wrong."""
        key = _cache_key(spec)
        with self._lock:
            if key in self._cache:
                self._cache.move_to_end(key)
                return self._cache[key]
        future = self._pool.submit(self._compile, spec)
        try:
            grammar = future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise ValueError(
                f"the {spec.kind} constraint did not compile within {self.timeout_s:g} s: simplify it"
            ) from None
        with self._lock:
            self._cache[key] = grammar
            if len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return grammar

    def _compile(self, spec: StructuredOutputsParams) -> str:
        matcher = self.llg.LLMatcher
        try:
            if spec.json_object or spec.json is not None:
                schema = spec.json if spec.json is not None else {"type": "object"}
                grammar = matcher.grammar_from_json_schema(schema, overrides=JSON_LAYOUT)
            elif spec.regex is not None:
                grammar = matcher.grammar_from_regex(spec.regex)
            elif spec.choice is not None:
                grammar = self.llg.grammar_from("choice", spec.choice)
            else:  # Lark, or GBNF / EBNF (vLLM's xgrammar dialect), converted
                grammar = self.llg.grammar_from("grammar", spec.grammar)
            error = matcher.validate_grammar(grammar, self.tokenizer)
        except (ValueError, TypeError, RuntimeError) as err:
            error = str(err)
        if error:
            raise ValueError(
                f"structured outputs: the {spec.kind} constraint is invalid: {one_line_error(error)}"
            )
        return grammar

    def matcher(self, grammar: str, stop_token_ids: list[int]) -> Matcher:
        """A fresh matcher (one per sequence) of a compiled grammar: it may end on stop_token_ids."""
        return Matcher(self.llg.LLMatcher(self.tokenizer, grammar, log_level=0), frozenset(stop_token_ids))

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def one_line_error(error: str) -> str:
    """llguidance's message on one line: a regex error's source excerpt and caret dropped, its cause kept."""
    lines = error.splitlines()
    cause = next((line.removeprefix("error: ") for line in lines if line.startswith("error: ")), None)
    head = re.sub(r"^at \d+\(\d+\): ", "", lines[0] if lines else "")
    text = f"{head.rstrip(': ')}: {cause}" if cause else error
    return " ".join(text.split())[:300]


def _cache_key(spec: StructuredOutputsParams) -> str:
    value = getattr(spec, spec.kind) if spec.kind != "json_object" else True
    if isinstance(value, str):
        return f"{spec.kind}:{value}"
    return f"{spec.kind}:{json.dumps(value, sort_keys=True)}"
