"""What a package registers: its benchmark scripts and the targets their results answer."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Target:
    """A goal one figure of a benchmark's result answers.

    metric: where the figure sits in the result (tools.bench_ledger.select's paths, e.g.
    "rows[case=decode Hq=128].tflops"); goal: the figure to reach, in `unit`; issue: where the goal was set.
    """

    what: str
    metric: str
    goal: float
    unit: str
    higher_is_better: bool = True
    issue: int | None = None

    def met(self, value: float) -> bool:
        return value >= self.goal if self.higher_is_better else value <= self.goal


@dataclass(frozen=True, slots=True)
class Bench:
    """A benchmark script: module (under the package's `benchmarks`) with main() that parses sys.argv and
    returns its result (a JSON-able dict) or None (a sweep that only prints: its output is kept)."""

    module: str
    what: str
    targets: tuple[Target, ...] = field(default=())
    gpus: int = 1  # CUDA devices it uses (0: runs on the CPU)
