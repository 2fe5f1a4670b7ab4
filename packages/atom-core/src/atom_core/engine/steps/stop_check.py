"""Whether a sequence stops at its newest token: a stop or EOS token, a stop string in its text, or its
length limit. Detokenizes incrementally on the way (the text is what stop strings match)."""

from __future__ import annotations

from atom_core.engine.scheduling.scheduler import Scheduler
from atom_core.engine.scheduling.sequence import Sequence
from atom_core.engine.text.detokenizer import IncrementalDetokenizer
from atom_core.engine.text.stop_strings import StopScan


class StopCheck:
    def __init__(self, tokenizer, eos_token_ids: set[int], max_model_len: int, scheduler: Scheduler):
        self.tokenizer, self.eos_token_ids = tokenizer, eos_token_ids
        self.max_model_len, self.scheduler = max_model_len, scheduler

    def __call__(self, seq: Sequence) -> None:
        """After seq's newest token was appended: update its text; finish it if a stop condition hits."""
        p = seq.params
        token = seq.output_token_ids[-1]
        if self.tokenizer is not None:
            if seq.detokenizer is None:
                seq.detokenizer = IncrementalDetokenizer(self.tokenizer, p.skip_special_tokens)
            seq.text = seq.detokenizer.update(seq.output_token_ids)
        reason = None
        # a complete structured output ends it, before min_tokens too (masking.py lets it draw its end)
        constrained_done = seq.grammar is not None and seq.grammar.is_terminated()
        if len(seq.output_token_ids) < p.min_tokens and not constrained_done:  # its stops were banned, and
            while _stop_string_start(seq) >= 0:  # a stop string completed before min_tokens does not stop
                pass
        elif token in p.stop_token_ids or (not p.ignore_eos and token in self.eos_token_ids):
            reason = "stop"
        elif (cut := _stop_string_start(seq)) >= 0:
            end = seq.stop_scan.scanned if p.include_stop_str_in_output else cut
            seq.text, reason = seq.text[:end], "stop"
            seq.detokenizer = None  # the text is final
        elif constrained_done:
            reason = "stop"
        elif len(seq.output_token_ids) >= p.max_tokens or len(seq.token_ids) >= self.max_model_len:
            reason = "length"
        if reason is not None:
            if seq.detokenizer is not None:  # emit characters still waiting for their last bytes
                seq.text = seq.detokenizer.update(seq.output_token_ids, final=True)
            self.scheduler.finish(seq, reason)


def _stop_string_start(seq: Sequence) -> int:
    """Where the first stop string completed by seq's new text starts (-1: none): the request's automaton
    walks only the characters added since the last call."""
    stops = seq.params.stop_strings()
    if stops is None:
        return -1
    if seq.stop_scan is None:
        seq.stop_scan = StopScan(stops)
    return seq.stop_scan.feed(seq.text)
