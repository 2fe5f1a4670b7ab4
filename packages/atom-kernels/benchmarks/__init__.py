"""atom-kernels' benchmarks: scripts registered in registry.py, run by `python -m benchmarks run NAME`
from packages/atom-kernels; shared helpers live in harness/ (no script imports another)."""
