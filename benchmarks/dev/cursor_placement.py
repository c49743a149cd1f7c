"""Development only: does the placement of a step's flush rows in the batch change the replay step time?
Patterns of the staggered cursors (each has 1/L of the rows flushing at every step of an L-cycle):
mod: cursor = row % L (the bench's); block: cursor = (row // (batch/L)) % L (a step's flush rows adjacent).
  PYTHONPATH=. python3 benchmarks/dev/cursor_placement.py qwen3.5-4b:fp32:256:mod qwen3.5-4b:fp32:256:block
Used for benchmarks/results/dev/sweep-s11-2-cursor-placement.log."""
import sys

import torch

from trtllm_replayssm.lab.bench import kernels, ours, timing
from trtllm_replayssm.lab.bench.shapes import shape_from_preset

dev = torch.device("cuda", 0)
l2 = timing.l2_bytes(dev)
orig_fill = ours._fill_layer
pattern = "mod"
def fill(layer, shape, sd, idx, L, gen, device):
    orig_fill(layer, shape, sd, idx, L, gen, device)
    rows = torch.arange(idx.numel(), device=device, dtype=torch.int32)
    if pattern == "block":
        layer.cursor[idx.long()] = (rows // max(1, idx.numel() // L)) % L
ours._fill_layer = fill
for spec in sys.argv[1:]:  # MODEL:STATE_DTYPE:BATCH:mod|block
    model, sd, batch, pat = spec.split(":")
    batch = int(batch)
    pattern = pat
    shape = shape_from_preset(model)
    gen, step, pools = kernels.case_inputs(shape, sd, batch, l2, dev)
    case = ours.replay_case(shape, batch, sd, step, pools, 16, "replay", gen, dev)
    us = timing.time_calls([f for _ in range(16) for f in case.calls])
    print(f"{model:18s} {sd} b={batch} cursors={pat:5s}: replay {us:7.1f} us", flush=True)
    del case
    torch.cuda.empty_cache()
