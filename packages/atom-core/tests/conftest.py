import os
import sys
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tests are grouped by layer (engine/, models/, server/, integration/) and import their shared helpers from
# the core_fixtures package beside this file: --import-mode=importlib puts no test directory on sys.path,
# so this one is put there (processes the tests spawn inherit it).
sys.path.insert(0, str(Path(__file__).parent))

from core_fixtures.architectures import TINY_LLAMA
from core_fixtures.engine import install_token_counter
from core_fixtures.references import hf_greedy

from tools.testing_models import free_port, random_checkpoint


@pytest.fixture
def with_token_counter(monkeypatch):
    """Llama-family models built in this test carry a TokenCounter state layer; the counters built, in order."""
    return install_token_counter(monkeypatch)


@pytest.fixture
def atom_cache(tmp_path, monkeypatch):
    """A fresh, empty ATOM cache dir: what a machine with nothing cached has."""
    cache = tmp_path / "atom-cache"
    monkeypatch.setenv("ATOM_CACHE_DIR", str(cache))
    return cache


@pytest.fixture
def hf_greedy_tokens():
    """hf_greedy(model, prompt, steps): transformers' greedy continuation (an argmax loop over its KV cache)."""
    return hf_greedy


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory):
    """tiny_llama(**config) -> (transformers model, checkpoint dir): a random Llama, saved once per config."""
    made = {}

    def make(**overrides):
        key = repr(sorted(overrides.items()))
        if key not in made:
            from transformers import LlamaConfig

            path = tmp_path_factory.mktemp("tiny-llama") / "ckpt"
            made[key] = random_checkpoint(LlamaConfig(**{**TINY_LLAMA, **overrides}), path)
        return made[key]

    return make


@pytest.fixture
def a_free_port() -> int:
    return free_port()


class ServerProcess:
    """`atom serve` in a subprocess on a free localhost port; `stop()` sends SIGTERM and returns the exit code."""

    def __init__(self, args: list[str], cache_dir, env: dict | None = None, ready: bool = True):
        import subprocess
        import sys

        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.log_path = cache_dir / f"server-{self.port}.log"
        self._log = open(self.log_path, "w")  # noqa: SIM115 (closed by stop)
        # The server picks its own kernels (torch on the CPU): not the Triton interpreter set for these tests.
        inherited = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        env = {**inherited, "ATOM_CACHE_DIR": str(cache_dir), **(env or {})}
        self.proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "atom_core.cli",
                "serve",
                "--port",
                str(self.port),
                "--device",
                "cpu",
                *args,
            ],
            env=env,
            stdout=self._log,
            stderr=subprocess.STDOUT,
        )
        if ready:
            self.wait_ready()

    def wait_ready(self, timeout: float = 120) -> None:
        import time

        import httpx

        deadline = time.time() + timeout
        while time.time() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                if httpx.get(f"{self.base}/health", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.3)
        raise AssertionError(f"the server did not become ready:\n{self.log()}")

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()

    def stop(self, timeout: float = 30) -> int:
        if self.proc.poll() is None:
            self.proc.terminate()
        code = self.proc.wait(timeout=timeout)
        self._log.close()
        return code


@pytest.fixture(scope="module")
def start_server(tmp_path_factory):
    """start_server(args, env=None) -> a running ServerProcess; every one still running is stopped at the end."""
    cache = tmp_path_factory.mktemp("atom-cache")
    started: list[ServerProcess] = []

    def start(args: list[str], env: dict | None = None, ready: bool = True) -> ServerProcess:
        started.append(ServerProcess(args, cache, env, ready))
        return started[-1]

    yield start
    for server in started:
        if server.proc.poll() is None:
            server.proc.kill()
            server.proc.wait()


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    """The built-in demo checkpoint (a tokenizer with a chat template), made once in a cache of its own."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("ATOM_CACHE_DIR", str(tmp_path_factory.mktemp("atom-cache")))
        from atom_core.demo import ensure_demo_checkpoint

        return ensure_demo_checkpoint(log=lambda _: None)
