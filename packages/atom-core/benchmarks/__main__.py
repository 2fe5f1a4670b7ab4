"""`python -m benchmarks run NAME...`, `list` and `report` for atom-core (run from packages/atom-core with
atom_core and atom_kernels importable). The runner, ledger and report are the repository's tools/bench_ledger."""

import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(PACKAGE.parents[1]))  # the repository root, for tools.bench_ledger

from benchmarks.harness.ceilings import measure_ceilings  # noqa: E402
from benchmarks.registry import BENCHES  # noqa: E402
from tools.bench_ledger import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(BENCHES, PACKAGE, "atom-core performance", ceilings=measure_ceilings))
