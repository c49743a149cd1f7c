"""Replay launch-plan sweep (development only): each case times our replay with a Tuning, with the bench protocol
(cold-L2 pools, one CUDA graph over whole L-cycles, staggered cursors, medians), next to our baseline, and prints the
plan the op ran. A case may compile kernel sources from another directory (A/B of kernel variants in one process).

  PYTHONPATH=. python3 benchmarks/dev/plan_sweep.py CASES.json

CASES.json: a list of {"model", "state_dtype", "batch", "mode" (default "replay"), "tuning" (Tuning fields, e.g.
{"rows_per_cta": 16, "ctas_per_sm": 2, "stages": 3, "tail_fraction": null, "fold_buffer": false}), "plugins" (a kernel
source directory; default plugins/), "after" (a kernel every call follows, its own time subtracted: "plain" or "conv",
``bench kernels --after-plain-kernel`` / ``--after-conv``; default none)}.
"""
import json
import os
import sys

import torch

from trtllm_replayssm.core.jit.compiler import PLUGIN_DIR_ENV
from trtllm_replayssm.core.plans import Tuning
from trtllm_replayssm.lab.bench import byte_model, kernels, ours, timing
from trtllm_replayssm.lab.bench.peers import PeerCase
from trtllm_replayssm.lab.bench.shapes import BenchShape, shape_from_preset

L = 16
dev = torch.device("cuda", 0)
ceil, l2 = timing.copy_ceiling_gbps(dev), timing.l2_bytes(dev)
print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
baselines: dict[tuple, float] = {}


def timed(case_obj: PeerCase, shape: BenchShape, batch: int, pools: int, after: str | None) -> float:
    """µs per call over whole L-cycles, each call behind ``after`` (its own time subtracted) if given."""
    if not after:
        return kernels.time_case(case_obj, L, timing.MIN_REPLAYS, timing.time_calls)[0]
    before = kernels.NEIGHBOURS[after](shape, batch, dev)
    return (kernels.time_case(case_obj, L, timing.MIN_REPLAYS, timing.time_calls, before)[0]
            - kernels.neighbour_time(before, L, pools, timing.MIN_REPLAYS, timing.time_calls))


for case in json.loads(open(sys.argv[1]).read()):
    model, sd, batch, mode = case["model"], case["state_dtype"], case["batch"], case.get("mode", "replay")
    tuning, after = Tuning(**case.get("tuning", {})), case.get("after")
    if case.get("plugins"):
        os.environ[PLUGIN_DIR_ENV] = case["plugins"]
    else:
        os.environ.pop(PLUGIN_DIR_ENV, None)
    shape = shape_from_preset(model)
    gen, step, pools = kernels.case_inputs(shape, sd, batch, l2, dev)
    key = (model, sd, batch, case.get("plugins"), after)
    if key not in baselines:
        base_case = ours.baseline_case(shape, batch, sd, step, pools, gen, dev)
        baselines[key] = timed(base_case, shape, batch, pools, after)
        del base_case
    base = baselines[key]
    label = (f"{model} {sd} b={batch} mode={mode} {case.get('tuning', {})} src={case.get('plugins') or 'plugins'}"
             + (f" after={after}" if after else ""))
    try:
        replay = ours.replay_case(shape, batch, sd, step, pools, L, mode, gen, dev, tuning)
        us = timed(replay, shape, batch, pools, after)
    except Exception as exc:  # report and go on
        print(f"{label}: FAIL {type(exc).__name__}: {exc}", flush=True)
        continue
    plan = replay.plan
    gbps = batch * byte_model.step_bytes("replay", shape, sd, L, plan["mode"]) / (us * 1e-6) / 1e9
    print(f"{label}: replay {us:7.1f} us ({100 * gbps / ceil:4.1f}% copy) baseline {base:7.1f} us x{base / us:.3f} "
          f"| plan {plan['mode']} tile {plan['rows_per_cta']} grid {plan['grid'][0]} stages {plan['stages']} "
          f"fold {plan['fold_bytes']} tail {plan['tail_start']}/{plan['num_tiles']}", flush=True)
    del replay
    torch.cuda.empty_cache()
