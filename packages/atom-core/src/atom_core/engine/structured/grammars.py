"""An engine's grammar compiler (xgrammar's, over the checkpoint's tokenizer, its cache of compiled
grammars included) and each sequence's matcher: compiled once per request, off the engine's thread and
bounded in time, so a grammar can refuse its own request but never stall the others."""

from __future__ import annotations

import json
import re
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from atom_core.engine.structured.params import StructuredOutputsParams

# whitespace characters allowed between JSON elements: enough for indented output, never a loop of them
MAX_JSON_WHITESPACE = 32
COMPILE_TIMEOUT_S = 10.0
_BOUNDED_STRING_CHAR = r"[^\"\\\r\n]"  # (as xgrammar prints the class)
_JSON_STRING_CHAR = r"[^\0-\x1f\"\\]"
_LOG_PREFIX = re.compile(r"^\[[\d:]+\] \S+:\d+: ")


class Grammars:
    """Built over a checkpoint's tokenizer (for_tokenizer) or a vocabulary xgrammar was given directly
    (an xgrammar TokenizerInfo); vocab_size: the model's logits width (which may pad the tokenizer's)."""

    def __init__(self, tokenizer_info, vocab_size: int, timeout_s: float = COMPILE_TIMEOUT_S):
        import xgrammar as xgr

        self.xgr, self.vocab_size, self.timeout_s = xgr, vocab_size, timeout_s
        self.compiler = xgr.GrammarCompiler(tokenizer_info, max_threads=2, cache_enabled=True)
        # compilation runs here, waited for at most timeout_s: a pathological schema leaves a thread
        # busy, not the caller
        self._pool = ThreadPoolExecutor(2, thread_name_prefix="atom-grammar")

    @classmethod
    def for_tokenizer(cls, tokenizer, vocab_size: int, timeout_s: float = COMPILE_TIMEOUT_S) -> Grammars:
        """tokenizer: the checkpoint's (transformers) tokenizer."""
        import xgrammar as xgr

        return cls(
            xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size), vocab_size, timeout_s
        )

    def compile(self, spec: StructuredOutputsParams):
        """The compiled grammar of spec (an xgrammar CompiledGrammar); ValueError naming what is wrong."""
        future = self._pool.submit(self._compile, spec)
        try:
            return future.result(timeout=self.timeout_s)
        except FutureTimeout:
            raise ValueError(
                f"the {spec.kind} constraint did not compile within {self.timeout_s:g} s: simplify it"
            ) from None

    def _compile(self, spec: StructuredOutputsParams):
        c = self.compiler
        try:
            if spec.json_object or spec.json is not None:
                schema = (
                    spec.json if isinstance(spec.json, str) else json.dumps(spec.json or {"type": "object"})
                )
                return c.compile_grammar(self._json_grammar(schema))
            if spec.regex is not None:
                return c.compile_regex(spec.regex)
            if spec.choice is not None:
                return c.compile_grammar("root ::= " + " | ".join(json.dumps(s) for s in spec.choice))
            return c.compile_grammar(spec.grammar)
        except (RuntimeError, ValueError, TypeError) as err:  # xgrammar's parse and schema errors
            # (xgrammar's messages start with a log prefix: "[hh:mm:ss] /path/file.cc:83: ")
            detail = " ".join(_LOG_PREFIX.sub("", str(err)).split())[:300]
            raise ValueError(f"structured outputs: the {spec.kind} constraint is invalid: {detail}") from None

    def _json_grammar(self, schema: str) -> str:
        """The schema's grammar, its strings free of raw control characters: xgrammar 0.2's rule for a
        string with minLength / maxLength takes any character but quote, backslash, CR and LF, so U+0000 to
        U+001F (which JSON forbids unescaped) could be drawn there; its other strings already exclude them."""
        grammar = str(self.xgr.Grammar.from_json_schema(schema, max_whitespace_cnt=MAX_JSON_WHITESPACE))
        return grammar.replace(_BOUNDED_STRING_CHAR, _JSON_STRING_CHAR)

    def matcher(self, compiled, stop_token_ids: list[int]):
        """A fresh matcher (one per sequence): it ends after one of stop_token_ids."""
        return self.xgr.GrammarMatcher(compiled, override_stop_tokens=stop_token_ids or None)

    def shutdown(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
