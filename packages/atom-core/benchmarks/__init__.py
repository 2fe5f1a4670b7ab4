"""atom-core's benchmarks: scripts registered in registry.py, run by `python -m benchmarks run NAME` from
packages/atom-core; shared helpers live in harness/ (no script imports another)."""
