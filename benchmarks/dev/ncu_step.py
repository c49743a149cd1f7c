"""Steps of one shape and implementation, run eagerly for Nsight Compute (development only): each of the cold-L2
pool calls once to warm up, then STEPS more inside the NVTX range "profile". Profile with e.g.
  ncu --clock-control none --nvtx --nvtx-include "profile/" python3 benchmarks/dev/ncu_step.py MODEL SD BATCH 1
Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/ncu_step.py MODEL STATE_DTYPE BATCH [STEPS] [WHAT] [ROWS]
WHAT: a replay op mode (replay, fused, flush, auto; default replay), ``baseline`` or a peer's impl name (fla_gdn,
mamba_ssm_ssu, ...); ROWS: the state kernels' row tile (default: the planner's)."""
import sys

import torch

from trtllm_replayssm.core.limits import MODES
from trtllm_replayssm.core.plans import Tuning
from trtllm_replayssm.lab.bench import kernels, ours, peers, timing
from trtllm_replayssm.lab.bench.shapes import shape_from_preset

dev = torch.device("cuda", 0)
model, sd, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 4
what = sys.argv[5] if len(sys.argv) > 5 else "replay"
tuning = Tuning(rows_per_cta=int(sys.argv[6])) if len(sys.argv) > 6 else Tuning()
shape = shape_from_preset(model)
gen, step, pools = kernels.case_inputs(shape, sd, batch, timing.l2_bytes(dev), dev)
if what == "baseline":
    case = ours.baseline_case(shape, batch, sd, step, pools, gen, dev, tuning)
elif what in MODES:
    case = ours.replay_case(shape, batch, sd, step, pools, 16, what, gen, dev, tuning)
else:
    case = peers.build_peer(what, shape, batch, sd, step, pools, 16, gen, dev)
for f in case.calls:
    f()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("profile")
for i in range(steps):
    case.calls[i % len(case.calls)]()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
print(f"{model} {sd} b={batch} {what}: {len(case.calls)} pools, {steps} steps after warm-up", flush=True)
