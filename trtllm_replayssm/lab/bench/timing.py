"""GPU timing: copy-bandwidth ceiling and cold-L2 CUDA-graph timing of back-to-back calls (CUDA events, medians)."""
from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence

import torch

MIN_REPLAYS = 15
COLD_L2_FACTOR = 4  # rotated pools must exceed this many times the L2 size
MIN_POOLS = 4


def l2_bytes(device: torch.device) -> int:
    """L2 cache size of `device` in bytes (PyTorch's report; 60 MB on H200)."""
    return int(torch.cuda.get_device_properties(device).L2_cache_size)


def pools_for_cold_l2(pool_bytes: int, l2: int, factor: int = COLD_L2_FACTOR, minimum: int = MIN_POOLS) -> int:
    """Number of independent pools so that their total exceeds `factor` x L2 (and at least `minimum`)."""
    if pool_bytes <= 0:
        raise ValueError(f"pool_bytes: expected > 0, got {pool_bytes}")
    if l2 <= 0:
        raise ValueError(f"l2: expected > 0, got {l2}")
    return max(minimum, math.floor(factor * l2 / pool_bytes) + 1)


def _event_ms(fn: Callable[[], None], repeats: int, before_each: Callable[[], None] | None = None) -> list[float]:
    times = []
    for _ in range(repeats):
        if before_each is not None:
            before_each()
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return times


def _copy_ms(device: torch.device, nbytes: int, repeats: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device).fill_(1)
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    torch.cuda.synchronize(device)
    return statistics.median(_event_ms(lambda: dst.copy_(src), repeats))


def copy_ceiling_gbps(device: torch.device, nbytes: int = 1 << 30, repeats: int = MIN_REPLAYS) -> float:
    """Device-to-device copy bandwidth in GB/s (bytes read + written), median over `repeats` copies of `nbytes`."""
    ms = _copy_ms(device, nbytes, repeats)
    torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3) / 1e9


def time_calls(calls: Sequence[Callable[[], None]], replays: int = MIN_REPLAYS, warmup: int = 2,
               before_each: Callable[[], None] | None = None) -> float:
    """Median µs per call of `calls` run back to back, captured once into one CUDA graph.

    The caller orders `calls` (e.g. L steps of every pool, pools interleaved) so that the sequence is a whole number
    of cycles; the graph is replayed `replays` times and each replay's time is divided by ``len(calls)``.
    ``before_each``: run on the stream before the warm-up and before every replay, outside the timed region (e.g.
    restoring cursors so that every replay times the same steps).
    """
    if not calls:
        raise ValueError("calls: expected at least one callable, got none")
    if replays < MIN_REPLAYS:
        raise ValueError(f"replays: expected >= {MIN_REPLAYS}, got {replays}")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):  # eager warm-up off the default stream (lazy init, allocations)
        for fn in calls:
            fn()
    torch.cuda.current_stream().wait_stream(stream)
    if before_each is not None:
        before_each()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for fn in calls:
            fn()
    for _ in range(warmup):
        if before_each is not None:
            before_each()
        graph.replay()
    torch.cuda.synchronize()
    ms = statistics.median(_event_ms(graph.replay, replays, before_each))
    del graph
    return ms * 1e3 / len(calls)
