"""Small-batch launch variants beside the peers (development only): our baseline and ``auto`` replay with the shipped
launch, with the state kernels launched plainly (``Tuning(programmatic_state=False)``) and without L2 hints
(``Tuning(l2_hints=False)``), each timed as it is and behind a plainly launched kernel (the bench protocol's
``after_plain_kernel``, that kernel's own time subtracted), with every peer of the family timed the same two ways.
Each case's implementations are built once and timed in turn, ``--rounds`` times; JSON of every timing to OUT
(rewritten after each case), then a table of medians: µs per variant and the best peer.

  PYTHONPATH=. python3 benchmarks/dev/launch_variants.py OUT.json [--batches 1,8] [--models m1,m2] [--state-dtype fp32]
      [--rounds 3]
"""
import argparse
import json
import statistics

import torch

from trtllm_replayssm.core.plans import Tuning
from trtllm_replayssm.lab.bench import kernels, ours, peers, timing
from trtllm_replayssm.lab.bench.peers import PeerUnavailable
from trtllm_replayssm.lab.bench.shapes import shape_from_preset

TUNINGS = {"shipped": Tuning(), "plain_launch": Tuning(programmatic_state=False), "no_l2_hints": Tuning(l2_hints=False)}

ap = argparse.ArgumentParser()
ap.add_argument("out")
ap.add_argument("--batches", default="1,8")
ap.add_argument("--models", default="nemotron-3-nano-4b,nemotron-3-super-120b,qwen3.5-4b,kimi-linear-48b")
ap.add_argument("--state-dtype", default="fp32")
ap.add_argument("--rounds", type=int, default=3)
args = ap.parse_args()
L, dev, sd = 16, torch.device("cuda", 0), args.state_dtype
l2, replays = timing.l2_bytes(dev), timing.MIN_REPLAYS
records = []
for model in args.models.split(","):
    shape = shape_from_preset(model)
    for batch in map(int, args.batches.split(",")):
        gen, step, pools = kernels.case_inputs(shape, sd, batch, l2, dev)
        builders = {}
        for name, tuning in TUNINGS.items():
            builders[f"baseline/{name}"] = lambda t=tuning: ours.baseline_case(shape, batch, sd, step, pools, gen, dev, t)
            builders[f"auto/{name}"] = lambda t=tuning: ours.replay_case(shape, batch, sd, step, pools, L, "auto", gen,
                                                                        dev, t)
        for impl in peers.PEERS_BY_FAMILY[shape.family]:
            builders[impl] = lambda i=impl: peers.build_peer(i, shape, batch, sd, step, pools, L, gen, dev)
        neighbour = kernels.plain_neighbour(batch, dev)
        cases = {}
        for impl, build in builders.items():
            try:
                cases[impl] = build()
            except PeerUnavailable as exc:
                print(f"  skip {impl}: {exc}", flush=True)
        times = {impl: ([], []) for impl in cases}
        neighbour_times = []
        for _ in range(args.rounds):
            neighbour_us = kernels.neighbour_time(neighbour, L, pools, replays, timing.time_calls)
            neighbour_times.append(neighbour_us)
            for impl, case in cases.items():
                times[impl][0].append(kernels.time_case(case, L, replays, timing.time_calls)[0])
                times[impl][1].append(kernels.time_case(case, L, replays, timing.time_calls, neighbour)[0] - neighbour_us)
        row = {}
        for impl, (alone, behind) in times.items():
            row[impl] = (statistics.median(alone), statistics.median(behind))
            records.append({"model": model, "batch": batch, "state_dtype": sd, "impl": impl, "plan": cases[impl].plan,
                            "alone_us": alone, "behind_plain_us": behind, "neighbour_us": neighbour_times,
                            "alone_median_us": row[impl][0], "behind_plain_median_us": row[impl][1]})
        del cases
        torch.cuda.empty_cache()
        peer_rows = {k: v for k, v in row.items() if "/" not in k}
        for i, label in enumerate(("alone", "behind a plain kernel")):
            best = min(peer_rows, key=lambda k: peer_rows[k][i]) if peer_rows else None
            ourselves = "  ".join(f"{k} {v[i]:6.2f}" for k, v in row.items() if "/" in k)
            peer = f"best peer {best} {peer_rows[best][i]:6.2f}" if best else "no peer"
            print(f"{model:22s} b={batch:<3d} {label:22s} {ourselves}  | {peer}", flush=True)
        with open(args.out, "w") as f:  # after every case, so a run cut short keeps what it timed
            json.dump({"device": torch.cuda.get_device_name(dev), "L": L, "rounds": args.rounds, "records": records},
                      f, indent=1)
