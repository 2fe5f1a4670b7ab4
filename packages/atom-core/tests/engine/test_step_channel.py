"""StepChannel: rank 0's step inputs reach worker processes intact, in order, and oversized ones over gloo."""

import os
import signal
import time

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from atom_core.engine.execution.step_channel import StepChannel
from tools.testing_models import free_port

MESSAGES = [
    {"ids": [1, 2, 3]},
    list(range(5000)),
    "small",
    {"tables": [[7] * 300] * 4},
]  # 2nd, 4th > 256 bytes


def _init(rank: int, port: int):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=3)


def _echo(rank: int, port: int, channel: StepChannel, out) -> None:
    _init(rank, port)
    try:
        while (message := channel.receive(rank - 1)) is not None:
            out.put((rank, message))
    finally:
        dist.destroy_process_group()


def test_workers_receive_every_message_in_order_small_and_oversized():
    ctx = mp.get_context("spawn")
    port = free_port()
    channel = StepChannel(2, ctx, capacity=256)  # two of the messages take the gloo path
    out = ctx.Queue()
    workers = [ctx.Process(target=_echo, args=(r, port, channel, out), daemon=True) for r in (1, 2)]
    for w in workers:
        w.start()
    _init(0, port)
    try:
        for message in [*MESSAGES, None]:
            channel.send(message, workers_alive=lambda: all(w.is_alive() for w in workers))
        got = {1: [], 2: []}
        for _ in range(2 * len(MESSAGES)):
            rank, message = out.get(timeout=60)
            got[rank].append(message)
        assert got == {1: MESSAGES, 2: MESSAGES}
    finally:
        for w in workers:
            w.join(timeout=30)
        dist.destroy_process_group()
    assert all(w.exitcode == 0 for w in workers)


def _exit_after_one(channel: StepChannel) -> None:
    channel.receive(0)


def test_a_dead_worker_makes_send_raise_instead_of_hanging():
    ctx = mp.get_context("spawn")
    channel = StepChannel(1, ctx, capacity=256)
    worker = ctx.Process(target=_exit_after_one, args=(channel,), daemon=True)
    worker.start()
    channel.send("first", workers_alive=worker.is_alive)  # consumed, then the worker exits
    worker.join(timeout=60)
    channel.send("second", workers_alive=worker.is_alive)  # the buffer was freed: no wait yet
    with pytest.raises(RuntimeError, match="worker exited"):
        channel.send("third", workers_alive=worker.is_alive)  # "second" is never consumed


def _receive_forever(channel: StepChannel) -> None:
    channel.receive(0)  # rank 0 never sends: this must end once rank 0 is gone


def _rank0_that_dies(out) -> None:
    ctx = mp.get_context("spawn")
    channel = StepChannel(1, ctx, capacity=256)
    worker = ctx.Process(target=_receive_forever, args=(channel,))
    worker.start()
    out.put(worker.pid)
    out.close()
    out.join_thread()  # the pid is sent before the abrupt exit
    os._exit(0)  # abruptly: no shutdown message, no cleanup of the worker


def test_a_worker_exits_when_rank0_is_gone():
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    rank0 = ctx.Process(target=_rank0_that_dies, args=(out,))
    rank0.start()
    pid = out.get(timeout=60)
    rank0.join(timeout=60)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return  # the orphaned worker noticed and exited
        time.sleep(0.2)
    os.kill(pid, signal.SIGKILL)
    raise AssertionError("the worker kept waiting after rank 0 exited")
