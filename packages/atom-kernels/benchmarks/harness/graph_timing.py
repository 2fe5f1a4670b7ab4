"""Device time of calls replayed from a CUDA graph, as an engine's decode step runs them.

Eager timing of a ~40 us decode call measures the host's Python and launch cost as much as the kernel;
inside a graph only the device time is left. Calls rotate over input copies whose bytes together exceed
the L2 several times, so each call reads from DRAM as in a real decode step (whose KV dwarfs the L2).
"""

from __future__ import annotations

from collections.abc import Callable

import torch


def rotation(bytes_per_call: int, device: torch.device | str = "cuda") -> int:
    """Input copies to rotate over so that one call's bytes are out of the L2 when it runs again."""
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(1, -(-3 * l2 // bytes_per_call))


def graph_ms(calls: list[Callable[[], object]], min_replay_ms: float = 2.0, replays: int = 30) -> float:
    """Median milliseconds per call: `calls` (one per input copy) captured in turn into one graph, repeated
    so that a replay lasts about min_replay_ms, and replayed behind a sleep that lets the host queue them."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls:  # compile and allocate outside the capture
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for call in calls:
        call()
    end.record()
    end.synchronize()
    repeat = max(1, int(min_replay_ms / max(start.elapsed_time(end), 1e-3)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(repeat):
            for call in calls:
                call()
    graph.replay()
    torch.cuda.synchronize()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(replays)
    ]
    torch.cuda._sleep(50_000_000)  # ~25 ms at H200 clocks: the host queues every replay meanwhile
    for a, b in events:
        a.record()
        graph.replay()
        b.record()
    torch.cuda.synchronize()
    times = sorted(a.elapsed_time(b) for a, b in events)
    return times[len(times) // 2] / (repeat * len(calls))
