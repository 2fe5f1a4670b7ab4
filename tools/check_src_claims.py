"""Checks that no package source names a device or quotes a timing: measurements live in the benchmarks'
results and their READMEs, where the run that made them is recorded, never in `src`, where they go stale
unseen.

Flagged in packages/*/src/**/*.py: a GPU model (H100, H200, A100, MI300X, ...) and a number with a unit
of time or throughput (4.4 us, 2.90 ms, 751 TFLOP/s, 3.2 TB/s). Architecture names (sm_90, gfx942) and
results files' names (results/h200/sweep_decode_plan.jsonl#decode_plan_h200) are not claims and pass. Exit 0 when none is found;
otherwise each one is printed as path:line: text.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from tools.workspace import REPO

DEVICE = re.compile(r"\b(?:[ABH]\d{3}|GB\d{3}|MI\d{3}[AXL]?)\b")
TIMING = re.compile(r"\d(?:\.\d+)?\s?(?:ns|us|µs|ms|TFLOP/s|GFLOP/s|[GT]B/s)(?![\w/])")


def claims(root: Path = REPO) -> list[str]:
    found = []
    for path in sorted(root.glob("packages/*/src/**/*.py")):
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if DEVICE.search(line) or TIMING.search(line):
                found.append(f"{path.relative_to(root)}:{number}: {line.strip()}")
    return found


def main() -> int:
    found = claims()
    for line in found:
        print(line)
    if found:
        print(
            f"{len(found)} device names or timings in src: move them to the benchmarks' results",
            file=sys.stderr,
        )
        return 1
    print("src: no device names or timings")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
