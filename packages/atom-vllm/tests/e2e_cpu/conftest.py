"""Tiny random checkpoints saved by transformers, with a tokenizer trained here (no model hub), and
transformers' own greedy continuations as the ground truth (the helpers are in ../vllm_support.py)."""

import logging
import threading

import pytest
from vllm_support import (
    Checkpoint,
    recorded_lines,
    save_checkpoint,
    transformers_greedy,
    transformers_windows,
)


@pytest.fixture(scope="session")
def checkpoint_for(tmp_path_factory):
    """checkpoint_for(architecture, **config_kwargs): saved once per architecture and config per session."""
    made: dict[str, Checkpoint] = {}

    def get(architecture: str, **config_kwargs) -> Checkpoint:
        key = f"{architecture}{sorted(config_kwargs.items())}"
        if key not in made:
            path = tmp_path_factory.mktemp(architecture) / "ckpt"
            made[key] = save_checkpoint(architecture, path, config_kwargs)
        return made[key]

    return get


@pytest.fixture(scope="session")
def greedy_reference():
    """greedy_reference(checkpoint, prompt, steps) -> transformers' greedy tokens."""
    return lambda ckpt, prompt, steps: transformers_greedy(ckpt.path, prompt, steps)


@pytest.fixture(scope="session")
def windows_reference():
    """windows_reference(checkpoint) -> each layer's window in transformers' model of it."""
    return lambda ckpt: transformers_windows(ckpt.path)


def pytest_configure(config):
    config.addinivalue_line(
        "markers",
        "engine_processes: LLM(...)'s engine core and worker in processes of their own, as vLLM runs them"
        " by default (for a test that needs a process where ATOM never registered)",
    )


@pytest.fixture(autouse=True)
def engine_in_this_process(request, monkeypatch):
    """LLM(...)'s engine core and worker run in the test's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
    unless the test is marked engine_processes. As processes, vLLM's CPU engine core busy-polls its
    worker (a whole core; vLLM's "TODO: make scheduler proc sleep when idle") and each start spawns two
    interpreters that import vLLM again: on CI's two cores, beside the other suites, that made this
    suite CI's longest part. Each test still starts its engine as a fresh process would: vLLM loads its
    general plugins again (ATOM's register() runs), configures its logging on this test's output, and
    the distributed state the run leaves is torn down after the test."""
    if request.node.get_closest_marker("engine_processes"):
        yield
        return
    import vllm.logger
    import vllm.plugins

    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    monkeypatch.setattr(vllm.plugins, "plugins_loaded", False)
    # configured once per process otherwise: on the stream of the first test's capture, closed since
    monkeypatch.setattr(vllm.logger, "_last_configured_logging_config", None)
    yield
    import gc

    from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

    gc.collect()  # the test's LLM, before its groups go
    cleanup_dist_env_and_memory()


@pytest.fixture
def plugin_log():
    """The lines ATOM's vLLM plugin logs during the test, read from its logger: in the test's process
    vLLM loads its plugins before it configures its logging, so they would not reach the output."""
    from atom_vllm.plugin import PLUGIN

    with recorded_lines(PLUGIN.logger, logging.INFO) as lines:
        yield lines


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem):
    """Each test body runs in a thread of its own, whose Python frame stack starts empty. CPython 3.11
    allocates that stack in chunks and frees a chunk as soon as the call that opened it returns; at
    the depth of pytest's frames the Triton interpreter's innermost calls (the model's kernels, run by
    the engine in this process) sat on a chunk boundary, mapping and unmapping a chunk per call:
    6.9 million page faults and 2.2x the time of the same run from a script."""
    args = {name: pyfuncitem.funcargs[name] for name in pyfuncitem._fixtureinfo.argnames}
    raised: list[BaseException] = []

    def body() -> None:
        try:
            pyfuncitem.obj(**args)
        except BaseException as error:  # re-raised below, in pytest's thread
            raised.append(error)

    thread = threading.Thread(target=body, name=f"test:{pyfuncitem.name}")
    thread.start()
    thread.join()
    if raised:
        raise raised[0]
    return True
