"""Measure where ``mode="auto"`` should switch from the flush kernel to the replay kernels and write the crossover
table the planners read (``trtllm_replayssm/core/crossovers.json``, core/crossovers.py).

For each family's benchmark models and each state spec, both modes are timed at every batch (whole staggered
L-cycles, cold L2, CUDA graphs, medians; ``lab/bench/ours.replay_case``). The crossover of a (family, spec) is the
smallest batch from which replay beats flush at that batch and every larger one, over every model of the family,
in work items (batch x heads) per SM, rounded down; one table entry per (family, spec) for this GPU's arch.

    python3 benchmarks/dev/crossover_sweep.py --specs fp32,bf16 -o benchmarks/results/dev/crossovers-h200.json \
        --write-table
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from trtllm_replayssm.core import byte_model, crossovers
from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import parse_state_label
from trtllm_replayssm.core.plans import device_of
from trtllm_replayssm.lab.bench import timing
from trtllm_replayssm.lab.bench.ours import replay_case
from trtllm_replayssm.lab.bench.shapes import BenchShape, select_shapes

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]


def time_mode(shape: BenchShape, label: str, batch: int, mode: str, L: int, dev: torch.device) -> float:
    """µs per step of ``mode`` over whole staggered cycles (one call per cache, L calls per cycle)."""
    spec = parse_state_label(label)
    gen = torch.Generator().manual_seed(batch)
    step = family_of(shape.dims).random_step(shape.dims, batch, gen, dev, torch.bfloat16)
    n = timing.pools_for_cold_l2(byte_model.state_bytes(shape.dims, spec) * (batch + 1), timing.l2_bytes(dev))
    case = replay_case(shape, batch, spec, step, n, L, mode, gen, dev)
    return timing.time_calls([c for _ in range(L) for c in case.calls]) / L


def crossover(times: dict[int, tuple[float, float]]) -> int | None:
    """The smallest batch from which replay (second) beats flush (first) at it and every larger batch."""
    winning = [b for b in sorted(times) if all(times[c][1] < times[c][0] for c in times if c >= b)]
    return winning[0] if winning else None


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", required=True, help="raw JSON records")
    ap.add_argument("--families", default="mamba2,gdn,kda")
    ap.add_argument("--specs", default="fp32,bf16")
    ap.add_argument("-L", type=int, default=16)
    ap.add_argument("--write-table", action="store_true", help=f"rewrite {crossovers.TABLE.name} for this GPU")
    a = ap.parse_args()
    dev = torch.device("cuda")
    arch = device_of(dev).arch
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    records, entries = [], {(c.family, c.state, c.arch): c for c in crossovers.shipped()}
    for family in a.families.split(","):
        for label in a.specs.split(","):
            per_sm, shapes = [], select_shapes([family], None)
            for shape in shapes:
                times = {b: tuple(time_mode(shape, label, b, mode, a.L, dev) for mode in ("flush", "replay"))
                         for b in BATCHES}
                for b, (flush_us, replay_us) in times.items():
                    records.append({"family": family, "model": shape.model, "state": label, "batch": b, "arch": arch,
                                    "flush_us": flush_us, "replay_us": replay_us})
                    print(f"{family:6s} {shape.model:24s} {label:16s} b{b:<4d} flush {flush_us:8.1f} us  replay "
                          f"{replay_us:8.1f} us", flush=True)
                b = crossover(times)
                per_sm.append(b * shape.dims.heads // sms if b is not None else None)
            if all(p is not None for p in per_sm):
                entries[(family, label, arch)] = crossovers.Crossover(
                    family, label, arch, max(per_sm),
                    f"{torch.cuda.get_device_name(dev)}, {label}: replay beats flush from batch x heads / SMs >= "
                    f"{max(per_sm)} over {', '.join(s.model for s in shapes)} (benchmarks/dev/crossover_sweep.py)")
    with open(a.output, "w") as f:
        json.dump({"records": records}, f, indent=1)
    if a.write_table:
        table = json.loads(crossovers.TABLE.read_text())
        table["entries"] = [vars(c) for c in entries.values()]
        crossovers.TABLE.write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
