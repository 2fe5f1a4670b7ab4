"""The Python API as vLLM users write it: LLM's vLLM keywords (taken, or refused by name before anything
loads), LLM.chat through the chat template, a progress bar, `with LLM(...)`, and an engine seed that
repeats sampled output."""

import pytest

from atom_core.config import ConfigError
from atom_core.engine import LLM, SamplingParams
from atom_core.engine.text.chat_template import chat_prompt_ids

CPU = dict(device="cpu", kernel_backend="torch", num_kv_blocks=64, max_model_len=256)
MESSAGES = [{"role": "user", "content": "Tell me about paged attention"}]


@pytest.fixture(scope="module")
def llm(demo):
    with LLM(demo, **CPU) as llm:
        yield llm


@pytest.mark.parametrize(
    ("kwargs", "words"),
    [
        ({"trust_remote_code": True}, "trust_remote_code=True: ATOM runs no code from a checkpoint"),
        ({"swap_space": 4}, "LLM() got swap_space=4, which ATOM does not take; it takes: "),
        ({"tokenizer": "/nonexistent/tok"}, "tokenizer /nonexistent/tok: no such directory"),
        ({"chat_template": "no-such-file.jinja"}, "no such file, and not a Jinja template"),
        ({"seed": "7"}, "seed must be an integer"),
    ],
)
def test_a_keyword_atom_cannot_honour_is_refused_by_name(demo, kwargs, words, monkeypatch):
    from atom_core.engine.execution import model_runner

    def no_loading(*args, **kwargs):
        raise AssertionError("the model started loading before the keyword was refused")

    monkeypatch.setattr(model_runner.ModelRunner, "__init__", no_loading)
    with pytest.raises(ConfigError) as err:
        LLM(demo, **CPU, **kwargs)
    assert words in str(err.value)


def test_vllm_keywords_that_apply_are_taken(demo):
    with LLM(
        demo, **CPU, trust_remote_code=False, enable_prefix_caching=False, tokenizer=str(demo), seed=1
    ) as llm:
        assert not llm.engine.plan.prefix_caching
        assert ("prefix caching", "enable_prefix_caching=False") in llm.engine.plan.off
        assert llm.generate("Paged attention", SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs


def test_an_engine_seed_repeats_unseeded_sampled_output(demo):
    prompts = ["Paged attention keeps", "The quick brown fox"]
    sampled = SamplingParams(temperature=1.0, max_tokens=8, ignore_eos=True)  # no seed of its own
    runs = []
    for seed in (7, 7, 8):
        with LLM(demo, **CPU, seed=seed) as llm:
            runs.append([o.outputs[0].token_ids for o in llm.generate(prompts, sampled, use_tqdm=False)])
    assert runs[0] == runs[1] != runs[2]


def test_chat_renders_the_template_and_generates_as_generate_does(llm):
    greedy = SamplingParams(temperature=0, max_tokens=6)
    ids = chat_prompt_ids(llm.engine.tokenizer, MESSAGES)
    want = llm.generate({"prompt_token_ids": ids}, greedy, use_tqdm=False)[0]
    got = llm.chat(MESSAGES, greedy, use_tqdm=False)
    assert len(got) == 1 and got[0].prompt_token_ids == ids and got[0].outputs[0].text == want.outputs[0].text
    two = llm.chat([MESSAGES, MESSAGES], greedy, use_tqdm=False)  # a list of conversations
    assert [o.outputs[0].text for o in two] == [want.outputs[0].text] * 2
    plain = "{% for m in messages %}{{ m['content'] }}\n{% endfor %}"
    (custom,) = llm.chat(MESSAGES, greedy, use_tqdm=False, chat_template=plain)
    assert (
        custom.prompt_token_ids
        == llm.engine.tokenizer(MESSAGES[0]["content"] + "\n", add_special_tokens=False).input_ids
    )


def test_a_checkpoint_without_a_template_chats_with_one_given(demo, tmp_path):
    template = tmp_path / "template.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    with LLM(demo, **CPU, chat_template=str(template)) as llm:
        assert llm.engine.tokenizer.chat_template == template.read_text()
        (out,) = llm.chat(MESSAGES, SamplingParams(max_tokens=2), use_tqdm=False)
        assert (
            out.prompt_token_ids
            == llm.engine.tokenizer(
                "[user] Tell me about paged attention\n", add_special_tokens=False
            ).input_ids
        )


def test_generate_shows_a_progress_bar_unless_told_not_to(llm, capsys):
    llm.generate(["a", "b"], SamplingParams(max_tokens=2))
    assert "Processed prompts" in capsys.readouterr().err
    llm.generate(["a", "b"], SamplingParams(max_tokens=2), use_tqdm=False)
    assert "Processed prompts" not in capsys.readouterr().err


def test_leaving_a_with_block_shuts_the_engine_down(demo, monkeypatch):
    with LLM(demo, **CPU) as llm:
        calls = []
        monkeypatch.setattr(llm.engine, "shutdown", lambda: calls.append(True))
    assert calls == [True]


def test_an_engine_shut_down_drops_its_model_and_refuses_requests(demo):
    with LLM(demo, **CPU) as llm:
        llm.generate(["a"], SamplingParams(max_tokens=2), use_tqdm=False)
    runner = llm.engine.runner
    assert (runner.model, runner.caches) == (None, [])  # nothing of it is held any more
    with pytest.raises(RuntimeError, match=r"^this engine was shut down and takes no more requests"):
        llm.generate(["a"], SamplingParams(max_tokens=2), use_tqdm=False)
    llm.shutdown()  # a second call does nothing


def test_a_kernel_backend_no_op_implements_is_refused_by_name_before_loading():
    with pytest.raises(
        ConfigError, match=r"^kernel_backend 'aiter': no atom-kernels op has an aiter \(ROCm\)"
    ):
        LLM("/nonexistent", kernel_backend="aiter")
