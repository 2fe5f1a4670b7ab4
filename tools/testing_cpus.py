"""Threads for test processes that run side by side: each gets its share of the cores, not all of them.

torch's CPU ops run on OpenMP threads that spin while they wait for each other at the end of every
parallel region. When two processes each run as many threads as there are cores (the root session beside
a background suite, on CI's two cores), a spinning thread holds the core that the thread it waits for
needs: one DeepSeek-V3 MTP test took 15 s alone, 120 s beside one busy core, and 19 s with one thread
beside it. Only the thread count changes; every op computes the same.
"""

from __future__ import annotations

import os


def share_cores(processes: int) -> int:
    """Give this process, and every process it starts from now on, cores // processes threads (at least 1).

    Sets OMP_NUM_THREADS, which children read at start (the background suites, a test's engine workers
    and servers), and torch's thread count here where torch is installed. Returns the thread count."""
    threads = max(1, (os.cpu_count() or 1) // max(1, processes))
    os.environ["OMP_NUM_THREADS"] = str(threads)
    try:
        import torch
    except ImportError:
        return threads
    torch.set_num_threads(threads)
    return threads
