"""GPU time per kernel of our replay and baseline ops at one batch (development only): the torch profiler over many
back-to-back calls on cold-L2 pools (no CUDA graph, so launch gaps are not in the kernel times), mean device time
per call of each kernel, and the span of the first to the last kernel per call. With PDL the prep and main kernels
overlap, so their sum exceeds the span.
Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/op_kernel_times.py MODEL[,MODEL] BATCH [STATE_DTYPE]"""
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from trtllm_replayssm.lab.bench import kernels, ours, timing
from trtllm_replayssm.lab.bench.shapes import shape_from_preset

dev = torch.device("cuda", 0)
batch = int(sys.argv[2])
sd = sys.argv[3] if len(sys.argv) > 3 else "fp32"
l2 = timing.l2_bytes(dev)
for model in sys.argv[1].split(","):
    shape = shape_from_preset(model)
    gen, step, pools = kernels.case_inputs(shape, sd, batch, l2, dev)
    for name, case in (("baseline", ours.baseline_case(shape, batch, sd, step, pools, gen, dev)),
                       ("replay", ours.replay_case(shape, batch, sd, step, pools, 16, "replay", gen, dev))):
        calls = [f for _ in range(4) for f in case.calls]
        for f in calls:
            f()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for f in calls:
                f()
            torch.cuda.synchronize()
        per = defaultdict(float)
        events = sorted((e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA),
                        key=lambda e: e.time_range.start)
        for e in events:
            per[e.name] += e.time_range.elapsed_us() / len(calls)
        span = (events[-1].time_range.end - events[0].time_range.start) / len(calls)
        print(f"{model:22s} {sd} b={batch} {name:8s} span/call {span:7.1f} us | " +
              " | ".join(f"{k[:28]} {v:6.1f}" for k, v in sorted(per.items(), key=lambda kv: -kv[1])), flush=True)
        del case
        torch.cuda.empty_cache()
