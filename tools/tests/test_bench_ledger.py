"""The benchmark runner, ledger and report (tools/bench_ledger), and the packages' registries."""

from __future__ import annotations

import ast
import contextlib
import importlib.util
import subprocess
import sys

import pytest

from tools.bench_ledger import Bench, Target, main
from tools.bench_ledger.ledger import ceilings_in, device_slug, load
from tools.bench_ledger.report import render
from tools.bench_ledger.select import MissingMetric, declared_not_measured, pick
from tools.workspace import REPO

RESULT = {
    "model": "m1",
    "copy_tb_s": 4.2,
    "rows": [
        {"case": "decode B=1 L=32768 page=16", "ms": 2.0, "pct": 70.0},
        {"case": "decode B=1 L=32768 page=16 fp8", "ms": 1.0, "pct": 80.0},
    ],
    "B1": {"step_ms": 4.0, "floor_ms": 2.0},
}


@pytest.mark.parametrize(
    ("path", "value"),
    [
        ("copy_tb_s", 4.2),
        ("rows[case=decode B=1 L=32768 page=16].pct", 70.0),
        ("rows[1].ms", 1.0),
        ("B1.floor_ms / B1.step_ms", 0.5),
        ("rows[case=decode B=1 L=32768 page=16].ms / rows[case=decode B=1 L=32768 page=16 fp8].ms", 2.0),
        ("[model=m1].B1.step_ms", 4.0),
    ],
)
def test_paths_pick_the_figure(path, value):
    assert pick(RESULT, path) == value


@pytest.mark.parametrize(
    "path", ["B2.step_ms", "rows[case=prefill].ms", "[model=m2].B1.step_ms", "copy_tb_s.x"]
)
def test_a_path_to_nothing_is_missing(path):
    with pytest.raises(MissingMetric):
        pick(RESULT, path)


def test_a_figure_a_run_left_out_is_declared_with_its_reason():
    result = {
        "rows": [{"model": "a", "batch": 1, "x": 2}],
        "not_measured": [{"model": "b", "why": "too big"}],
    }
    assert declared_not_measured(result, "rows[model=b,batch=1].x") == "too big"
    assert declared_not_measured(result, "rows[model=a,batch=1].x") is None
    assert declared_not_measured(result, "rows[model=c,batch=64].x") is None
    assert declared_not_measured({"rows": []}, "rows[model=b,batch=1].x") is None


def test_device_slugs_and_ceilings():
    assert device_slug("NVIDIA H200") == "h200"
    assert device_slug("NVIDIA H100 80GB HBM3", 2) == "h100x2"
    assert device_slug("cpu") == "cpu"
    assert ceilings_in(RESULT) == {"copy_tb_s": 4.2}
    assert ceilings_in(None) == {}


@pytest.fixture
def package(tmp_path, monkeypatch):
    """A package folder with benchmarks/ holding two scripts: one returns its result, one only prints."""
    bench = tmp_path / "benchmarks"
    bench.mkdir()
    (bench / "__init__.py").write_text("")
    (bench / "bench_fake.py").write_text(
        "import argparse\n"
        "def main():\n"
        "    p = argparse.ArgumentParser(); p.add_argument('--scale', type=float, default=1.0)\n"
        "    a = p.parse_args()\n"
        "    print('timing')\n"
        "    return {'rows': [{'case': 'x', 'ms': 2.0 * a.scale}]}\n"
    )
    (bench / "sweep_fake.py").write_text("def main():\n    print('a sweep table')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "benchmarks" or m.startswith("benchmarks.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setenv("ATOM_BENCH_COMMIT", "c0ffee")
    benches = {
        "fake": Bench("bench_fake", "a fake.", (Target("x time", "rows[case=x].ms", 3.0, "ms", False, 1),)),
        "sweep": Bench("sweep_fake", "a sweep.", gpus=0),
    }
    return tmp_path, benches


def test_runs_append_records_and_the_report_shows_the_latest(package, capsys):
    root, benches = package
    assert main(benches, root, "Fake", argv=["run", "fake", "--label", "before"]) == 0
    assert main(benches, root, "Fake", argv=["run", "fake", "--", "--scale", "2"]) == 0
    assert main(benches, root, "Fake", argv=["run", "sweep"]) == 0
    ledgers = load(root / "benchmarks" / "results")
    (slug,) = ledgers
    first, second = ledgers[slug]["fake"]
    assert first["label"] == "before" and first["args"] == [] and first["result"]["rows"][0]["ms"] == 2.0
    assert second["args"] == ["--scale", "2"] and second["result"]["rows"][0]["ms"] == 4.0
    assert first["commit"] and first["date"].endswith("Z") and "seconds" in second
    (sweep,) = ledgers[slug]["sweep"]
    assert sweep["result"] is None and "a sweep table" in sweep["output"]
    assert "timing" in capsys.readouterr().out  # the benchmark's own output still reaches the terminal
    text = render("Fake", benches, root / "benchmarks" / "results")
    assert "| x time | " in text and "| 4 ms | <= 3 ms (#1) | no |" in text
    assert main(benches, root, "Fake", argv=["report", "--check"]) == 1
    assert main(benches, root, "Fake", argv=["report"]) == 0
    assert main(benches, root, "Fake", argv=["report", "--check"]) == 0
    # a baseline run after it is kept, but the report still shows the package's own latest figure
    assert main(benches, root, "Fake", argv=["run", "fake", "--baseline", "--", "--scale", "9"]) == 0
    assert load(root / "benchmarks" / "results")[slug]["fake"][-1]["baseline"] is True
    assert "| 4 ms | <= 3 ms (#1) | no |" in render("Fake", benches, root / "benchmarks" / "results")
    # a figure the run voided (NaN, its reason in the record) is shown as such, neither met nor missed
    assert main(benches, root, "Fake", argv=["run", "fake", "--", "--scale", "nan"]) == 0
    assert "| voided, see the record | <= 3 ms (#1) |  |" in render(
        "Fake", benches, root / "benchmarks" / "results"
    )


def test_under_torchrun_only_rank_0_records(package, monkeypatch):
    root, benches = package
    monkeypatch.setenv("RANK", "1")
    assert main(benches, root, "Fake", argv=["run", "fake"]) == 0
    assert load(root / "benchmarks" / "results") == {}
    monkeypatch.setenv("RANK", "0")
    assert main(benches, root, "Fake", argv=["run", "fake"]) == 0
    assert len(next(iter(load(root / "benchmarks" / "results").values()))["fake"]) == 1


def test_an_unknown_name_is_refused_with_the_registered_ones(package, capsys):
    root, benches = package
    with pytest.raises(SystemExit):
        main(benches, root, "Fake", argv=["run", "nope"])
    assert "registered: fake, sweep" in capsys.readouterr().err


PACKAGES = ("atom-kernels", "atom-core")


def _registry(package: str) -> dict[str, Bench]:
    path = REPO / "packages" / package / "benchmarks" / "registry.py"
    spec = importlib.util.spec_from_file_location(f"_registry_{package.replace('-', '_')}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.BENCHES


@pytest.mark.parametrize("package", PACKAGES)
def test_every_script_is_registered_with_a_main_and_imports_no_sibling(package):
    folder = REPO / "packages" / package / "benchmarks"
    scripts = {p.stem for p in folder.glob("*.py") if p.stem not in ("__init__", "__main__", "registry")}
    registered = {bench.module for bench in _registry(package).values()}
    assert registered == scripts
    for name in scripts:
        tree = ast.parse((folder / f"{name}.py").read_text())
        assert any(isinstance(n, ast.FunctionDef) and n.name == "main" for n in tree.body), name
        imported = {
            (node.module or "").split(".")[0]
            if isinstance(node, ast.ImportFrom)
            else alias.name.split(".")[0]
            for node in ast.walk(tree)
            if isinstance(node, ast.Import | ast.ImportFrom)
            for alias in node.names
        }
        assert not imported & scripts, f"{name} imports {imported & scripts}: shared code goes to harness/"


@pytest.mark.parametrize("package", PACKAGES)
def test_performance_md_is_the_report_of_the_ledgers(package):
    """Regenerate with `python -m benchmarks report` from the package folder after a run."""
    root = REPO / "packages" / package
    title = f"{package} performance"
    assert (root / "PERFORMANCE.md").read_text() == render(
        title, _registry(package), root / "benchmarks" / "results"
    )


@pytest.mark.parametrize("package", PACKAGES)
def test_every_target_finds_its_figure_where_its_benchmark_has_records(package):
    """A target whose benchmark has run reads a figure from at least one of its records (a mistyped path
    would leave the target "not measured" for good); one whose benchmark has not run waits for it."""
    ledgers = load(REPO / "packages" / package / "benchmarks" / "results")
    for name, bench in _registry(package).items():
        records = [r for by_bench in ledgers.values() for r in by_bench.get(name, [])]
        for target in bench.targets:
            found, declared = [], []
            for record in records:
                with contextlib.suppress(MissingMetric):
                    found.append(pick(record["result"], target.metric))
                declared.append(declared_not_measured(record["result"], target.metric))
            # A run that left a figure out says why (a model too big for that device): it waits for another.
            assert found or not records or any(declared), f"{name}: no record holds {target.metric}"
            assert all(isinstance(v, int | float) for v in found), f"{target.metric} is not a number"


def test_every_record_names_a_commit_of_this_history():
    """A record's commit is the code it measured: one reworded away (a rebase after the run) would point
    at nothing, so rewording remaps the ledgers' commit fields."""
    if _git("rev-parse", "--is-shallow-repository").strip() == "true":
        pytest.skip("a shallow clone lacks the history the records name")
    commits = sorted(
        {
            record["commit"]
            for package in PACKAGES
            for by_bench in load(REPO / "packages" / package / "benchmarks" / "results").values()
            for records in by_bench.values()
            for record in records
            if record.get("commit")
        }
    )
    answers = _git("cat-file", "--batch-check", stdin="".join(f"{c}^{{commit}}\n" for c in commits))
    missing = [line.split("^")[0] for line in answers.splitlines() if line.endswith(" missing")]
    assert not missing, f"ledger records name commits not in this history: {missing}"


def _git(*args: str, stdin: str | None = None) -> str:
    return subprocess.run(
        ["git", "-C", str(REPO), *args], input=stdin, capture_output=True, text=True, check=True
    ).stdout
