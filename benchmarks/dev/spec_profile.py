"""Kernel times of one speculative verify case (development only): the replay verify's prep / main / commit kernels
and the per-draft baseline's, from torch.profiler over eager steps on cold-L2 pools. Run on the GPU host:
  PYTHONPATH=. python3 benchmarks/dev/spec_profile.py MODEL BATCH T [STEPS [TUNINGS]]
(TUNINGS: one or more Tunings separated by ";", each as key=value pairs, e.g. "rows_per_cta=64,ctas_per_sm=2;
rows_per_cta=32"; the replay verify is timed once per Tuning, the per-draft baseline once), or under Nsight Compute
with the NVTX range "profile"."""
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from trtllm_replayssm.core.plans import Tuning
from trtllm_replayssm.lab.bench import spec
from trtllm_replayssm.lab.bench.shapes import shape_from_preset

dev = torch.device("cuda", 0)
model, batch, window = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 16
tunings = {t: Tuning(**{k: int(v) for k, v in (kv.split("=") for kv in t.split(","))})
           for t in sys.argv[5].split(";")} if len(sys.argv) > 5 else {"default": None}
shape = shape_from_preset(model)
gen = torch.Generator().manual_seed(0)
ring = spec.ring_len(16, window)
step = spec.window_step(shape.dims, batch, window, gen, dev)
accepted = torch.randint(1, window + 1, (batch,), generator=gen).to(torch.int32).to(dev)
pools = 4


def profile_calls(label: str, calls: list) -> None:
    """Prints the mean device time per verify step of each kernel the calls launch (eager, after a warm-up pass)."""
    for f in calls:
        f()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        torch.cuda.nvtx.range_push("profile")
        for i in range(steps):
            calls[i % len(calls)]()
        torch.cuda.nvtx.range_pop()
        torch.cuda.synchronize()
    totals = defaultdict(float)
    for evt in prof.events():
        if evt.device_type == torch.autograd.DeviceType.CUDA:
            totals[evt.name] += evt.device_time / steps
    print(f"{model} b={batch} T={window} {label}: µs per verify step")
    for k, v in sorted(totals.items(), key=lambda kv: -kv[1]):
        print(f"  {v:9.1f}  {k[:90]}")


for text, tuning in tunings.items():
    replay, _, tile = spec._replay_calls(shape, batch, "fp32", step, accepted, window, ring, pools, gen, dev, tuning)
    profile_calls(f"replay (rows_per_cta {tile}; {text})", replay)
    del replay
per_draft, _, _ = spec._per_draft_calls(shape, batch, "fp32", step, accepted, window, pools, gen, dev)
profile_calls("per_draft", per_draft)
