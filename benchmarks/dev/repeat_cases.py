"""Timing spread of our replay at one shape (development only): CASES fresh replay cases (new caches, cold-L2 pools,
staggered cursors), each timed TIMINGS times with the bench protocol, to tell a case-dependent (allocation) spread
from a call-to-call one (each timing with its wall-clock end, to line up with nvidia-smi samples); with IMPL "baseline", our baseline op instead.
Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/repeat_cases.py MODEL STATE_DTYPE BATCH CASES TIMINGS [IMPL]"""
import sys
import time

import torch

from trtllm_replayssm.lab.bench import kernels, ours, timing
from trtllm_replayssm.lab.bench.shapes import shape_from_preset

dev = torch.device("cuda", 0)
model, sd, batch, n_cases, n_timings = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
impl = sys.argv[6] if len(sys.argv) > 6 else "replay"
shape = shape_from_preset(model)
gen, step, pools = kernels.case_inputs(shape, sd, batch, timing.l2_bytes(dev), dev)
for i in range(n_cases):
    case = (ours.baseline_case(shape, batch, sd, step, pools, gen, dev) if impl == "baseline"
            else ours.replay_case(shape, batch, sd, step, pools, 16, "replay", gen, dev))
    for j in range(n_timings):
        us = timing.time_calls([f for _ in range(16) for f in case.calls])
        print(f"{model} {sd} b={batch} {impl} case {i} timing {j}: {us:7.1f} us (done at "
              f"{time.strftime('%H:%M:%S', time.gmtime())}.{int(time.time() * 1000) % 1000:03d} UTC)", flush=True)
    del case
    torch.cuda.empty_cache()
