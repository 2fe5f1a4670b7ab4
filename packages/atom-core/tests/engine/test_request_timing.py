"""What the engine tells a request observer (the server's metrics): each request's first token, its new
tokens a step at a time, and its end with the reason, also for aborts and failures."""

from atom_core.engine import LLM, SamplingParams


class Recorder:
    def __init__(self):
        self.events = []

    def first_token(self, ttft_s, prompt_tokens):
        assert ttft_s >= 0
        self.events.append(("first", prompt_tokens))

    def new_tokens(self, count, since_last_s):
        assert since_last_s is None or since_last_s >= 0
        self.events.append(("tokens", count, since_last_s is None))

    def finished(self, reason, prompt_tokens, generation_tokens, e2e_s):
        self.events.append(("end", reason, prompt_tokens, generation_tokens))


def test_tokens_step_by_step_then_the_end_and_aborts_and_failures(demo):
    with LLM(demo, device="cpu", kernel_backend="torch", num_kv_blocks=64, max_model_len=128) as llm:
        engine, seen = llm.engine, Recorder()
        engine.observe_requests(seen)
        params = SamplingParams(n=2, temperature=1.0, seed=3, max_tokens=3, ignore_eos=True)
        engine.add_request({"prompt_token_ids": [5, 6, 7, 8]}, params, request_id="done")
        while engine.has_unfinished_requests():
            engine.step()
        # both samples' tokens a step: 2, 2, 2; the first with no gap before it
        assert seen.events == [
            ("first", 4),
            ("tokens", 2, True),
            ("tokens", 2, False),
            ("tokens", 2, False),
            ("end", "length", 4, 6),
        ]
        seen.events.clear()
        engine.add_request({"prompt_token_ids": [9, 9]}, SamplingParams(max_tokens=50), request_id="left")
        engine.step()
        engine.abort("left")
        engine.add_request({"prompt_token_ids": [3]}, SamplingParams(max_tokens=50), request_id="failed")
        engine.fail({"failed": "a test's failure"})
        assert seen.events == [
            ("first", 2),
            ("tokens", 1, True),
            ("end", "abort", 2, 1),
            ("end", "error", 1, 0),
        ]
        engine.observe_requests(None)
        engine.add_request({"prompt_token_ids": [3]}, SamplingParams(max_tokens=2), request_id="unseen")
        while engine.has_unfinished_requests():
            engine.step()
        assert len(seen.events) == 4
