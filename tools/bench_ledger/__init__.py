"""The benchmark runner, results ledger and performance report each package's `benchmarks/` uses.

A package registers its benchmark scripts (`benchmarks/registry.py`: name -> module, with the targets its
results answer), and `python -m benchmarks run NAME...` from the package folder runs them, appending one
record per run to `benchmarks/results/<device>/<NAME>.jsonl`. `python -m benchmarks report` writes the
package's PERFORMANCE.md from those ledgers: each target's latest figure beside its goal.
"""

from tools.bench_ledger.cli import main
from tools.bench_ledger.registry import Bench, Target

__all__ = ["Bench", "Target", "main"]
