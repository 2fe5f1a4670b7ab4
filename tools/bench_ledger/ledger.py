"""One JSONL ledger per benchmark and device: `results/<device>/<bench>.jsonl`, a record per run."""

from __future__ import annotations

import datetime
import json
import os
import re
import subprocess
from pathlib import Path

# Keys benchmarks have used for the ceilings they measure in the same run.
CEILING_KEYS = (
    "copy_tb_s",
    "copy_TBps",
    "copy_bw_gbs",
    "copy_bandwidth_TBps",
    "bf16_mm_tflops",
    "bf16_matmul_tflops",
)


def device_slug(name: str, count: int = 1) -> str:
    """A folder name for a device: "NVIDIA H200" -> "h200", two of them "h200x2", the CPU "cpu"."""
    if name == "cpu":
        return "cpu"
    words = re.sub(r"^nvidia\s+", "", name.strip().lower()).split()
    slug = re.sub(r"[^a-z0-9]+", "", words[0]) if words else "unknown"
    return f"{slug}x{count}" if count > 1 else slug


def current_device(gpus: int = 1) -> tuple[str, str]:
    """(device name, slug) of the machine a benchmark of `gpus` GPUs runs on: its CUDA devices, or the CPU."""
    import torch

    if not torch.cuda.is_available():
        return "cpu", "cpu"
    name = torch.cuda.get_device_name(0)
    return name, device_slug(name, torch.cuda.device_count() if gpus > 1 else 1)


def commit_of(repo: Path) -> tuple[str, bool]:
    """(HEAD commit, whether the tree has changes): ATOM_BENCH_COMMIT where it is set (a tree copied to a
    device machine, whose .git, if any, is not the tree's), else from git."""
    if os.environ.get("ATOM_BENCH_COMMIT"):
        return os.environ["ATOM_BENCH_COMMIT"], False
    try:
        head = subprocess.run(
            ["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        return head, bool(status.strip())
    except (OSError, subprocess.CalledProcessError):
        return "unknown", False


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def ceilings_in(result: object) -> dict[str, float]:
    """The ceilings a result states (copy bandwidth, matmul rate), by the keys benchmarks use."""
    if not isinstance(result, dict):
        return {}
    return {k: result[k] for k in CEILING_KEYS if isinstance(result.get(k), int | float)}


def append(results: Path, slug: str, bench: str, record: dict) -> Path:
    """Append record to results/<slug>/<bench>.jsonl; returns the ledger's path."""
    path = results / slug / f"{bench}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(record, sort_keys=True) + "\n")
    return path


def load(results: Path) -> dict[str, dict[str, list[dict]]]:
    """{device slug: {bench: records in file order}} of every ledger under results."""
    ledgers: dict[str, dict[str, list[dict]]] = {}
    for path in sorted(results.glob("*/*.jsonl")):
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        ledgers.setdefault(path.parent.name, {})[path.stem] = records
    return ledgers
