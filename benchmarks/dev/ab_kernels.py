"""Same-process A/B of two kernel-source directories (development only): for each model, state dtype and batch, one
replay case (cold-L2 pools, staggered cursors, the shipped plan) timed with the bench protocol alternately with the
sources of DIR_A and DIR_B (ABAB...), medians per source and their ratio; JSON of every timing to OUT.

  PYTHONPATH=. python3 benchmarks/dev/ab_kernels.py DIR_A DIR_B OUT.json [--batches 8,256] [--state-dtypes fp32,bf16]
      [--models m1,m2] [--rounds 3] [--mode replay|flush|auto|baseline] [--served-launch] [--after-plain-kernel]

``--served-launch`` plans as the TensorRT-LLM module does (``SERVING_TUNING``: state kernels launched plainly);
``--after-plain-kernel`` puts a plainly launched elementwise kernel before every call and subtracts its own time
(``kernels.plain_neighbour``), the kernel before a served decode op.
"""
import argparse
import json
import os
import statistics

import torch

from trtllm_replayssm.core.jit.compiler import PLUGIN_DIR_ENV
from trtllm_replayssm.core.plans import Tuning
from trtllm_replayssm.serving.trtllm.model_cache import SERVING_TUNING
from trtllm_replayssm.lab.bench import kernels, ours, timing
from trtllm_replayssm.lab.bench.shapes import BENCH_MODELS, shape_from_preset

ap = argparse.ArgumentParser()
ap.add_argument("dir_a")
ap.add_argument("dir_b")
ap.add_argument("out")
ap.add_argument("--batches", default="8,256")
ap.add_argument("--state-dtypes", default="fp32,bf16")
ap.add_argument("--models", default=",".join(BENCH_MODELS))
ap.add_argument("--rounds", type=int, default=3)
ap.add_argument("--mode", default="replay")
ap.add_argument("--served-launch", action="store_true")
ap.add_argument("--after-plain-kernel", action="store_true")
args = ap.parse_args()
tuning = SERVING_TUNING if args.served_launch else Tuning()
L, dev = 16, torch.device("cuda", 0)
l2 = timing.l2_bytes(dev)
records = []
for model in args.models.split(","):
    shape = shape_from_preset(model)
    for sd in args.state_dtypes.split(","):
        for batch in map(int, args.batches.split(",")):
            gen, step, pools = kernels.case_inputs(shape, sd, batch, l2, dev)
            if args.mode == "baseline":
                case = ours.baseline_case(shape, batch, sd, step, pools, gen, dev, tuning)
            else:
                case = ours.replay_case(shape, batch, sd, step, pools, L, args.mode, gen, dev, tuning)
            neighbour = kernels.plain_neighbour(batch, dev) if args.after_plain_kernel else None
            times = {"A": [], "B": []}
            for _ in range(args.rounds):
                neighbour_us = (kernels.neighbour_time(neighbour, L, pools, timing.MIN_REPLAYS, timing.time_calls)
                                if neighbour is not None else 0.0)
                for name, src in (("A", args.dir_a), ("B", args.dir_b)):
                    os.environ[PLUGIN_DIR_ENV] = src
                    times[name].append(kernels.time_case(case, L, timing.MIN_REPLAYS, timing.time_calls,
                                                         neighbour)[0] - neighbour_us)
            a, b = statistics.median(times["A"]), statistics.median(times["B"])
            records.append({"model": model, "state_dtype": sd, "batch": batch, "mode": args.mode, "plan": case.plan,
                            "served_launch": args.served_launch, "after_plain_kernel": args.after_plain_kernel,
                            "a_us": times["A"], "b_us": times["B"], "a_median_us": a, "b_median_us": b,
                            "b_over_a": b / a})
            print(f"{model:22s} {sd} b={batch:<4d} A {a:8.2f} us  B {b:8.2f} us  B/A {b / a:.4f}  "
                  f"(A {' '.join(f'{t:.1f}' for t in times['A'])} | B {' '.join(f'{t:.1f}' for t in times['B'])})",
                  flush=True)
            del case
            torch.cuda.empty_cache()
os.environ.pop(PLUGIN_DIR_ENV, None)
json.dump({"device": torch.cuda.get_device_name(dev), "dir_a": args.dir_a, "dir_b": args.dir_b, "records": records},
          open(args.out, "w"), indent=1)
worst = max(abs(r["b_over_a"] - 1) for r in records)
print(f"{len(records)} cases, largest |B/A - 1| = {100 * worst:.2f}%")
