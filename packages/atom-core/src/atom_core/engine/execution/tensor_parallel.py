"""Tensor parallel for the engine: rank 0 in this process, ranks 1..N-1 in spawned worker processes.

Rank 0 schedules and hands each step's inputs to the workers through shared memory (StepChannel; the
gloo control group carries setup, oversized messages and shutdown); every rank runs the same forward on
its shards (the layers' collectives keep them in step); rank 0 samples. NCCL carries the model's
collectives on GPUs, gloo on the CPU.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from atom_core.config import ModelConfig, ParallelConfig
from atom_core.engine.config import EngineConfig
from atom_core.engine.execution.ahead_rows import ahead_tokens
from atom_core.engine.execution.model_runner import ModelRunner
from atom_core.engine.execution.runner import DraftResult, StepResult
from atom_core.engine.execution.step_channel import StepChannel
from atom_core.engine.execution.step_inputs import DraftInputs, StepInputs
from atom_core.engine.execution.tensor_split import check_tensor_split


def _loopback_listener() -> socket.socket:
    """The rendezvous socket, bound to loopback only: the ranks share one host, nothing else may connect."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    return listener


def _device(base: torch.device, rank: int) -> torch.device:
    return torch.device("cuda", rank) if base.type == "cuda" else base


def _init(rank: int, size: int, port: int, device: torch.device, listener: socket.socket | None = None):
    """Join the process group through rank 0's loopback store; gloo's and NCCL's own sockets use the
    loopback interface too (unless the environment names another). The store takes the listener's
    descriptor over and closes it itself: Python must not close it a second time."""
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")
    fd = {} if listener is None else {"master_listen_fd": listener.detach()}
    store = dist.TCPStore("127.0.0.1", port, size, is_master=listener is not None, **fd)
    dist.init_process_group(
        "nccl" if device.type == "cuda" else "gloo", store=store, rank=rank, world_size=size
    )
    return dist.new_group(backend="gloo")


def _worker(
    rank: int, size: int, port: int, device: torch.device, runner_args: dict[str, Any], channel: StepChannel
) -> None:
    device = _device(device, rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    control = _init(rank, size, port, device)
    try:
        runner = ModelRunner(
            **runner_args,
            parallel=ParallelConfig(size, rank, dist.group.WORLD),
            device=device,
            control_group=control,
        )
        # this rank's own last results, which rank 0's next messages refer to (fed tokens, draft sources):
        # the last target step's, and every draft forward's since it
        last: dict[str, StepResult | DraftResult] = {}
        drafts: list[DraftResult] = []
        while True:
            message = channel.receive(rank - 1, group=control)
            if message is None:
                break
            if isinstance(message, StepInputs):
                last["target"] = runner.run(message, _fed(message, last, drafts), last.get("target"))
                drafts.clear()
            else:
                last["draft"] = runner.run_draft(message, last[message.source])
                drafts.append(last["draft"])
        runner.shutdown()
        _leave_together(device, control)
    except BaseException:
        dist.destroy_process_group()
        raise
    os._exit(0)  # torn down already; skip the interpreter's exit handlers (CUDA, NCCL) after it


def _fed(inputs: StepInputs, last: dict, drafts: list[DraftResult]) -> torch.Tensor | None:
    """The tokens a worker's target step takes at inputs.fed_rows, from its own results (as rank 0's)."""
    if not inputs.fed_rows:
        return None
    if inputs.fed_source == "drafts":
        return torch.cat([d.tokens for d in drafts])
    if inputs.fed_source == "ahead":
        return ahead_tokens(last["target"], drafts)
    return last["target"].sampled


def _leave_together(device: torch.device, control) -> None:
    """Every rank, at shutdown: finish the GPU's queued work, meet, then destroy the groups at the same time.

    Destroying NCCL communicators may be collective (torch shuts groups down in one fixed order for that
    reason): a rank that destroys while a peer waits elsewhere (joining a process) stalls both. The
    rank's CUDA graphs must be released first (ModelRunner.shutdown)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    dist.barrier(group=control)
    dist.destroy_process_group()


class TensorParallelRunner:
    """A ModelRunner on rank 0 that keeps size - 1 worker ranks in step with it (the Runner protocol)."""

    def __init__(self, model_config: ModelConfig, engine: EngineConfig, *, device: torch.device):
        size = engine.tensor_parallel_size
        if device.type == "cuda" and size > torch.cuda.device_count():
            # One rank per GPU: a rank without a GPU would die and leave the others waiting forever.
            raise ValueError(
                f"tensor_parallel_size {size} needs {size} GPUs, {torch.cuda.device_count()} are visible "
                "(use fewer ranks, or device='cpu' for tensor parallel over gloo)"
            )
        check_tensor_split(model_config, engine, size)  # here, before size - 1 workers would each raise it
        listener = _loopback_listener()
        port = listener.getsockname()[1]
        args = dict(model_config=model_config, engine=engine)
        context = mp.get_context("spawn")
        self.channel = StepChannel(size - 1, context)
        self.workers = [
            context.Process(target=_worker, args=(r, size, port, device, args, self.channel), daemon=True)
            for r in range(1, size)
        ]
        for proc in self.workers:
            proc.start()
        device = _device(device, 0)
        self.control = _init(0, size, port, device, listener)
        self.runner = ModelRunner(
            **args,
            parallel=ParallelConfig(size, 0, dist.group.WORLD),
            device=device,
            control_group=self.control,
        )
        self.plan = self.runner.plan
        self.weight_bytes = self.runner.weight_bytes  # (rank 0's: every rank holds as much)

    def run(
        self, inputs: StepInputs, fed: torch.Tensor | None = None, behind: StepResult | None = None
    ) -> StepResult:
        """fed must come from the results inputs.fed_source names, behind be the last target step (each
        worker uses its own)."""
        self.channel.send(inputs, group=self.control, workers_alive=self._workers_alive)
        return self.runner.run(inputs, fed, behind)

    def run_draft(self, inputs: DraftInputs, source: StepResult | DraftResult) -> DraftResult:
        """source must be the last target step (inputs.source "target") or draft forward ("draft")."""
        self.channel.send(inputs, group=self.control, workers_alive=self._workers_alive)
        return self.runner.run_draft(inputs, source)

    def _workers_alive(self) -> bool:
        return all(proc.is_alive() for proc in self.workers)

    def shutdown(self) -> None:
        if not self.workers:
            return
        self.channel.send(None, group=self.control, workers_alive=self._workers_alive)
        self.runner.shutdown()
        _leave_together(self.runner.device, self.control)
        for proc in self.workers:  # each exits right after its groups are destroyed
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
        self.workers = []
