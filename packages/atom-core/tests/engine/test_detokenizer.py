"""Incremental detokenization equals decoding the whole output, step by step and at the end."""

import random

from transformers import AutoTokenizer

from atom_core.demo import ensure_demo_checkpoint
from atom_core.engine.text.detokenizer import IncrementalDetokenizer


def test_incremental_text_equals_whole_decodes(atom_cache):
    tok = AutoTokenizer.from_pretrained(ensure_demo_checkpoint(log=lambda _: None))
    rng = random.Random(0)
    texts = ["Paged attention, naïve café — 東京 🚀 done.", " leading  spaces\tand\nlines ", "ü" * 7]
    streams = [tok(t, add_special_tokens=False).input_ids for t in texts]
    # byte-level tokens in random order: many end inside a multi-byte character
    streams += [[rng.randrange(len(tok)) for _ in range(60)] for _ in range(20)]
    streams.append([tok.eos_token_id, *streams[0], tok.bos_token_id])  # special tokens are skipped
    for ids in streams:
        detok = IncrementalDetokenizer(tok)
        for n in range(1, len(ids) + 1):
            text = detok.update(ids[:n])
            whole = tok.decode(ids[:n], skip_special_tokens=True)
            assert whole.startswith(text)  # never ahead of, never different from, the whole decode
            if not whole.endswith("\ufffd"):  # nothing waits for more bytes: it has caught up
                assert text == whole
        assert detok.update(ids, final=True) == tok.decode(ids, skip_special_tokens=True)
