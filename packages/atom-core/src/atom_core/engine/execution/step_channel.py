"""Rank 0 -> worker ranks: each step's inputs through shared host memory (all ranks run on one host).

A gloo broadcast of pickled inputs is two TCP round trips per step, and in tensor parallel every rank
waits for the slowest to reach the forward's first all-reduce, so that latency adds to each step.
Here rank 0 pickles the inputs into a shared buffer and wakes each worker with a semaphore; a worker
copies the bytes out and signals back, so the buffer is free for the next step. The semaphores' system
calls order the buffer's writes before the reads on any CPU. A message larger than the buffer goes
over the gloo group instead (prefill steps of huge batches), flagged in the header.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import pickle
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

DEFAULT_CAPACITY = 16 << 20  # bytes: a pickled step of 256 sequences x 512 pages is under 1 MiB
_OVER_GLOO = -1
_POLL_S = 1.0  # how often a blocked rank checks that its peers still live


class StepChannel:
    """Created on rank 0 before the workers are spawned and passed to them (picklable with mp's spawn)."""

    def __init__(self, num_workers: int, context, capacity: int = DEFAULT_CAPACITY):
        self.capacity = capacity
        self.size = torch.zeros(1, dtype=torch.int64).share_memory_()  # bytes in the buffer, or _OVER_GLOO
        self.buffer = torch.empty(capacity, dtype=torch.uint8).share_memory_()
        self.ready = [context.Semaphore(0) for _ in range(num_workers)]  # a message waits for worker i
        self.free = [context.Semaphore(1) for _ in range(num_workers)]  # worker i has copied the last one

    def send(self, message: Any, group=None, workers_alive: Callable[[], bool] | None = None) -> None:
        """Rank 0: hand `message` to every worker; `group` carries messages larger than the buffer.

        Raises RuntimeError if `workers_alive` says a worker exited while rank 0 waited for it."""
        payload = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        for free in self.free:
            while not free.acquire(timeout=_POLL_S):
                if workers_alive is not None and not workers_alive():
                    raise RuntimeError("a tensor-parallel worker exited; its log says why")
        over = len(payload) > self.capacity
        if over:
            self.size[0] = _OVER_GLOO
        else:
            ctypes.memmove(self.buffer.data_ptr(), payload, len(payload))
            self.size[0] = len(payload)
        for ready in self.ready:
            ready.release()
        if over:
            dist.broadcast_object_list([message], src=0, group=group)

    def receive(self, worker: int, group=None) -> Any:
        """Worker `worker` (rank worker + 1): block until rank 0 sends, and return the message.

        Raises RuntimeError if rank 0's process is gone (the worker then exits instead of waiting forever)."""
        parent = multiprocessing.parent_process()
        while not self.ready[worker].acquire(timeout=_POLL_S):
            if parent is not None and not parent.is_alive():
                raise RuntimeError("tensor-parallel rank 0 exited")
        size = int(self.size[0])
        if size == _OVER_GLOO:
            self.free[worker].release()
            box = [None]
            dist.broadcast_object_list(box, src=0, group=group)
            return box[0]
        payload = ctypes.string_at(self.buffer.data_ptr(), size)
        self.free[worker].release()
        return pickle.loads(payload)
