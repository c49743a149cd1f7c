"""Commit kernel times (development only): spec.commit (one layer, batch rows) and spec.commit_layers (48 layers x
batch rows in one launch), µs per call in CUDA graphs (each call after a cursor reset; the resets alone subtracted),
medians of 15 replays; with --slot-ids also the 48-layer commit after ``decode_slot_ids`` of the same ids (what the
serving glue ran before the commit took upstream's ids as they are). LABEL prefixes each line;
$TRTLLM_REPLAYSSM_PLUGIN_DIR times another source tree's kernel.

  PYTHONPATH=. python3 benchmarks/dev/commit_time.py LABEL [--slot-ids]
"""
import argparse
from collections.abc import Callable
from types import SimpleNamespace

import torch

from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.ops import spec
from trtllm_replayssm.serving.trtllm.core import decode_slot_ids

WINDOW, RING, CALLS_PER_GRAPH, REPLAYS = 4, 19, 20, 15
CASES = [(1, 1), (8, 1), (64, 1), (256, 1), (512, 1), (8, 48), (64, 48), (256, 48), (512, 48)]  # (batch, layers)


def graph_us(body: Callable[[], None]) -> float:
    """Median µs per repetition of ``body`` in a CUDA graph of CALLS_PER_GRAPH repetitions."""
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        for _ in range(3):
            body()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(CALLS_PER_GRAPH):
            body()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(REPLAYS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1000 / CALLS_PER_GRAPH)
    return sorted(times)[REPLAYS // 2]


def commit_us(batch: int, layers: int, slot_ids: bool = False) -> float:
    """µs of one commit of ``batch`` rows (distinct slots, accepted counts 1..WINDOW) in ``layers`` layers;
    ``slot_ids``: the ids through ``decode_slot_ids`` first."""
    words = torch.full((layers, batch), spec_cursor.pack(0, 2), dtype=torch.int32, device="cuda")
    cursor = words.clone()
    ids = torch.randperm(batch, device="cuda").int()
    accepted = torch.randint(1, WINDOW + 1, (batch,), device="cuda", dtype=torch.int32)

    def reset() -> None:
        cursor.copy_(words)

    def commit() -> None:
        reset()
        rows = decode_slot_ids(ids, batch) if slot_ids else ids
        if layers == 1:
            spec.commit(SimpleNamespace(cursor=cursor[0], buffer_len=RING), accepted, rows, -1, window=WINDOW)
        else:
            spec.commit_layers(cursor, RING, accepted, rows, -1, window=WINDOW)

    return graph_us(commit) - graph_us(reset)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("label", nargs="?", default="", help="prefix of every line")
    ap.add_argument("--slot-ids", action="store_true", help="also the 48-layer commit after decode_slot_ids")
    args = ap.parse_args()
    label = args.label
    for batch, layers in CASES:
        print(f"{label} commit batch {batch:4d} layers {layers:2d}: {commit_us(batch, layers):6.2f} us", flush=True)
        if args.slot_ids and layers > 1:
            print(f"{label} decode_slot_ids + commit batch {batch:4d} layers {layers:2d}: "
                  f"{commit_us(batch, layers, slot_ids=True):6.2f} us", flush=True)


if __name__ == "__main__":
    main()
