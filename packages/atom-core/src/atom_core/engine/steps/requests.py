"""The engine's live requests: each one's samples (sequences), how a request ends (finished, aborted,
failed), and the output a step reports for it, as its output kind asks."""

from __future__ import annotations

from dataclasses import dataclass, field

from atom_core.engine.outputs import CompletionOutput, OutputKind, RequestOutput
from atom_core.engine.scheduling.scheduler import Scheduler
from atom_core.engine.scheduling.sequence import Sequence, Status
from atom_core.engine.steps.request_timing import RequestClock, RequestObserver


@dataclass(slots=True)
class Request:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    seqs: list[Sequence] = field(default_factory=list)
    clock: RequestClock = field(default_factory=RequestClock)

    @property
    def generated(self) -> int:
        """Output tokens of all its samples so far."""
        return sum(len(s.output_token_ids) for s in self.seqs)


class RequestTable(dict[str, Request]):
    """Request id -> Request, for every request not yet reported finished. observer: told each request's
    timing and end (metrics), or None."""

    def __init__(self, scheduler: Scheduler):
        super().__init__()
        self.scheduler = scheduler
        self.observer: RequestObserver | None = None

    def add(self, request: Request) -> None:
        for seq in request.seqs:
            self.scheduler.add(seq)
        self[request.request_id] = request

    def abort(self, request_id: str) -> None:
        request = self.pop(request_id, None)
        for seq in request.seqs if request else []:
            self._end(seq, "abort")
        if request is not None:
            self._observe_end(request, "abort")

    def _observe_end(self, request: Request, reason: str) -> None:
        if self.observer is not None:
            request.clock.end(self.observer, reason, len(request.prompt_token_ids), request.generated)

    def fail(self, reasons: dict[str, str]) -> list[RequestOutput]:
        """End these requests ({request id: why}) with an error, their blocks freed."""
        outputs = []
        for request_id, reason in reasons.items():
            if (request := self.pop(request_id, None)) is None:
                continue
            for seq in request.seqs:
                self._end(seq, "error")
            self._observe_end(request, "error")
            out = self.output(request, pop=False)
            out.error = reason
            outputs.append(out)
        return outputs

    def _end(self, seq: Sequence, reason: str) -> None:
        if seq.status is Status.RUNNING:
            self.scheduler.finish(seq, reason)
        elif seq.status is Status.WAITING:
            self.scheduler.waiting.remove(seq)
            seq.status, seq.finish_reason = Status.FINISHED, reason

    def output(self, request: Request, pop: bool) -> RequestOutput | None:
        """The request's output after a step, as its output kind asks (None: FINAL_ONLY, still running)."""
        finished = all(s.status is Status.FINISHED for s in request.seqs)
        if pop and self.observer is not None:  # (a step's output: fail() reports its own end)
            request.clock.advance(self.observer, request.generated, len(request.prompt_token_ids))
            if finished:
                self._observe_end(request, request.seqs[0].finish_reason or "stop")
        if finished and pop:
            self.pop(request.request_id, None)
        kind = request.seqs[0].params.output_kind
        if kind is OutputKind.FINAL_ONLY and not finished:
            return None
        scored = request.seqs[0].prompt_logprobs
        if kind is OutputKind.DELTA and request.seqs[0].num_sent_tokens > 0:
            scored = None  # (carried by the first output)
        outputs = [_completion(s, delta=kind is OutputKind.DELTA) for s in request.seqs]
        return RequestOutput(
            request.request_id,
            request.prompt,
            request.prompt_token_ids,
            outputs,
            finished,
            prompt_logprobs=scored,
        )

    def outputs(self, advanced: list[str], failed: dict[str, str]) -> list[RequestOutput]:
        """A step's outputs: the failed requests' errors, then each advanced request's output (in order,
        once each)."""
        outputs = self.fail(failed)
        for request_id in dict.fromkeys(advanced):
            request = self.get(request_id)
            if request is not None and (out := self.output(request, pop=True)) is not None:
                outputs.append(out)
        return outputs


def _settled_length(seq: Sequence) -> int:
    """How much of seq's text is settled: all but a tail that may still become a stop string while it
    runs. What is reported (and streamed) never has to be taken back, so streamed text equals the final
    text."""
    if seq.status is Status.FINISHED or seq.stop_scan is None:
        return len(seq.text)
    return len(seq.text) - seq.stop_scan.held


def _completion(seq: Sequence, *, delta: bool) -> CompletionOutput:
    """seq's output: all of it, or (delta) what earlier outputs have not carried, without copying the rest.
    Settled text only grows (a stop string found later starts inside the held-back tail), so a delta
    never takes text back."""
    settled, tokens = _settled_length(seq), seq.output_token_ids
    start_char, start_token = (seq.num_sent_chars, seq.num_sent_tokens) if delta else (0, 0)
    if delta:
        seq.num_sent_chars, seq.num_sent_tokens = settled, len(tokens)
    return CompletionOutput(
        seq.index,
        seq.text[start_char:settled],
        tokens[start_token:],
        seq.finish_reason,
        seq.output_logprobs[start_token:] if seq.params.logprobs is not None else None,
        seq.num_drafted,
        seq.num_accepted,
    )
