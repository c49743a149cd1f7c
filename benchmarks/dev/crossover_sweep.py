"""Measure where ``mode="auto"`` should switch kernels and write the crossover table the planners read
(``trtllm_replayssm/core/crossovers.json``, core/crossovers.py).

For each family's benchmark models and each state spec, the flush kernel, the one-launch replay (``fused``) and the
replay kernels are timed at every batch (µs per step over whole staggered L-cycles, cold L2, CUDA graphs, medians;
``lab/bench/ours.replay_case``). Per model, replay takes over at the smallest batch from which it beats the better
of flush and fused at it and every larger batch; below that, fused takes over from flush at the smallest batch from
which it beats flush at it and every larger batch of the band. Each switch is placed, in work items (batch x heads)
per SM, at the geometric mean of that batch and the measured batch below it (unmeasured batches between them go to
the nearer side on a log scale), above the losing batch. The table entry of a (family, spec) takes the largest switch
over the family's models (none for fused unless every model has one). ``--from-records`` recomputes the table from
the raw records of an earlier run instead of measuring.

The state kernels launch as programmatic dependents (the default tuning), each call behind the previous one, and the
entries apply to any launch (``launch`` ``*``). ``--served-launch`` times the served case behind upstream's conv
instead (a mixed batch's Mamba-2 decode rows, and GDN/KDA where our conv cannot run), as ``bench kernels
--served-launch --after-plain-kernel`` does (the TensorRT-LLM module's tuning, every call behind a plainly launched
kernel whose own time is subtracted), and its entries apply to plainly launched state kernels only (``launch``
``plain``). ``--after-conv`` times every call behind our conv1d decode step (``bench kernels --after-conv``: the
served pure-decode case and the reference decoders'), its own time subtracted, and its entries apply
to programmatic launches (``launch`` ``programmatic``).

    python3 benchmarks/dev/crossover_sweep.py --specs fp32,bf16 -o benchmarks/results/dev/crossovers-h200.json \
        --write-table
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Callable

import torch

from trtllm_replayssm.core import byte_model, crossovers
from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import parse_state_label
from trtllm_replayssm.core.plans import Tuning, device_of
from trtllm_replayssm.lab.bench import kernels, timing
from trtllm_replayssm.lab.bench.ours import replay_case
from trtllm_replayssm.lab.bench.shapes import BenchShape, select_shapes
from trtllm_replayssm.serving.trtllm.model_cache import SERVING_TUNING

BATCHES = [1, 2, 4, 8, 16, 32, 64, 128]
TIMED_MODES = ("flush", "fused", "replay")


# What each call follows, and the launch of the state kernels there: (neighbour (kernels.NEIGHBOURS; None: the
# previous call), tuning, the launch its entries apply to).
SETUPS = {"chained": (None, Tuning(), "*"), "served": ("plain", SERVING_TUNING, "plain"),
          "after-conv": ("conv", Tuning(), "programmatic")}


def time_mode(shape: BenchShape, label: str, batch: int, mode: str, L: int, dev: torch.device,
              setup: str = "chained") -> float:
    """µs per step of ``mode`` over whole staggered cycles (one call per cache, L calls per cycle) in ``setup``
    (SETUPS): each call behind the previous one, or behind its neighbour kernel, whose own time is subtracted."""
    neighbour_kind, tuning, _ = SETUPS[setup]
    spec = parse_state_label(label)
    gen = torch.Generator().manual_seed(batch)
    step = family_of(shape.dims).random_step(shape.dims, batch, gen, dev, torch.bfloat16)
    n = timing.pools_for_cold_l2(byte_model.state_bytes(shape.dims, spec) * (batch + 1), timing.l2_bytes(dev))
    case = replay_case(shape, batch, spec, step, n, L, mode, gen, dev, tuning)
    if neighbour_kind is None:
        return kernels.time_case(case, L, timing.MIN_REPLAYS, timing.time_calls)[0]
    neighbour = kernels.NEIGHBOURS[neighbour_kind](shape, batch, dev)
    return (kernels.time_case(case, L, timing.MIN_REPLAYS, timing.time_calls, neighbour)[0]
            - kernels.neighbour_time(neighbour, L, n, timing.MIN_REPLAYS, timing.time_calls))


def crossover(times: dict[int, tuple[float, float]]) -> int | None:
    """The smallest batch from which the second time beats the first at it and every larger batch."""
    winning = [b for b in sorted(times) if all(times[c][1] < times[c][0] for c in times if c >= b)]
    return winning[0] if winning else None


def bands(times: dict[int, dict[str, float]]) -> tuple[int | None, int | None]:
    """(replay crossover, start of the fused band below it) of one model's times per batch and mode (crossover)."""
    b_replay = crossover({b: (min(t["flush"], t["fused"]), t["replay"]) for b, t in times.items()})
    below = {b: (t["flush"], t["fused"]) for b, t in times.items() if b_replay is None or b < b_replay}
    return b_replay, crossover(below) if below else None


def switch_per_sm(batch: int | None, batches: list[int], heads: int, sms: int) -> float | None:
    """Work items per SM where a switch found at ``batch`` goes: the geometric mean of it and the measured batch
    below it (``batch`` itself when it is the smallest measured)."""
    if batch is None:
        return None
    lower = [b for b in batches if b < batch]
    per_sm = batch * heads / sms
    return math.sqrt(max(lower) * heads / sms * per_sm) if lower else per_sm


def table_entry(family: str, label: str, arch: str, gpu: str, times: dict[str, dict[int, dict[str, float]]],
                heads: dict[str, int], sms: int, launch: str = "*") -> crossovers.Crossover | None:
    """The crossover entry of (family, spec, launch) from each model's times per batch and mode (None: replay never
    keeps winning for some model). The replay threshold is an integer above every batch where replay loses."""
    replay, fused = [], []
    for model, per_batch in times.items():
        batches = sorted(per_batch)
        b_replay, b_fused = bands(per_batch)
        if b_replay is None:
            return None
        losing = [b * heads[model] / sms for b in batches if b < b_replay]
        at = switch_per_sm(b_replay, batches, heads[model], sms)
        replay.append(max(math.floor(at), math.floor(max(losing)) + 1) if losing else math.floor(at))
        f_at = switch_per_sm(b_fused, batches, heads[model], sms)
        fused.append(None if f_at is None else math.floor(100 * f_at) / 100)
    fused_per_sm = max(fused) if all(f is not None for f in fused) else None
    band = ("no fused band (fused does not beat flush below it)" if fused_per_sm is None
            else f"fused beats flush below it from {fused_per_sm}")
    served = {"plain": ", served launch", "programmatic": ", behind the conv1d step"}.get(launch, "")
    return crossovers.Crossover(
        family, label, arch, max(replay),
        f"{gpu}, {label}{served}: replay beats flush and fused from batch x heads / SMs >= {max(replay)}, {band} over "
        f"{', '.join(times)} (benchmarks/dev/crossover_sweep.py)", fused_per_sm, launch)


def measure(families: list[str], models: list[str] | None, specs: list[str], batches: list[int], arch: str,
            time: Callable[[BenchShape, str, int, str], float], on_record: Callable[[list[dict]], None],
            launch: str = "*") -> list[dict]:
    """Raw records: µs per step of every timed mode (``time(shape, spec, batch, mode)``), per family, spec, model
    (``models``: only these, each of one of ``families``; None: every benchmark model of them) and batch, each with
    the ``launch`` its entries apply to; ``on_record`` gets the records so far after each one."""
    records = []
    shapes = select_shapes(families, models)
    for family in families:
        for label in specs:
            for shape in (s for s in shapes if s.family == family):
                for b in batches:
                    t = {mode: time(shape, label, b, mode) for mode in TIMED_MODES}
                    records.append({"family": family, "model": shape.model, "heads": shape.dims.heads, "state": label,
                                    "batch": b, "arch": arch, "launch": launch,
                                    **{f"{mode}_us": us for mode, us in t.items()}})
                    on_record(records)
                    print(f"{family:6s} {shape.model:24s} {label:16s} b{b:<4d} "
                          + "  ".join(f"{mode} {us:8.1f} us" for mode, us in t.items()), flush=True)
    return records


def entries_from(records: list[dict], gpu: str, sms: int) -> list[crossovers.Crossover]:
    """One table entry per (family, spec, arch, launch) of the records (table_entry; records without a launch are
    of programmatic launches, their entries for any launch)."""
    groups: dict[tuple[str, str, str, str], dict[str, dict[int, dict[str, float]]]] = {}
    heads: dict[str, int] = {}
    for r in records:
        per_model = groups.setdefault((r["family"], r["state"], r["arch"], r.get("launch", "*")), {})
        per_model.setdefault(r["model"], {})[r["batch"]] = {mode: r[f"{mode}_us"] for mode in TIMED_MODES}
        heads[r["model"]] = r["heads"]
    found = [table_entry(family, label, arch, gpu, times, heads, sms, launch)
             for (family, label, arch, launch), times in groups.items()]
    return [e for e in found if e is not None]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", help="raw JSON records (measuring)")
    ap.add_argument("--from-records", help="recompute the table from this raw JSON instead of measuring")
    ap.add_argument("--families", default="mamba2,gdn,kda")
    ap.add_argument("--models", default="", help="benchmark models to time (default: every model of the families)")
    ap.add_argument("--specs", default="fp32,bf16")
    ap.add_argument("--batches", default=",".join(map(str, BATCHES)))
    ap.add_argument("-L", type=int, default=16)
    setups = ap.add_mutually_exclusive_group()
    setups.add_argument("--served-launch", action="store_true",
                        help="time the served case behind upstream's conv (plain launches behind a plain kernel); "
                             "its entries: launch 'plain'")
    setups.add_argument("--after-conv", action="store_true",
                        help="time every call behind our conv1d step (programmatic launches; the served pure-decode "
                             "case); its entries: launch 'programmatic'")
    ap.add_argument("--write-table", action="store_true", help=f"rewrite {crossovers.TABLE.name}")
    a = ap.parse_args()
    if a.from_records:
        raw = json.loads(open(a.from_records).read())
    else:
        if not a.output:
            ap.error("-o/--output is required when measuring")
        batches = sorted(int(b) for b in a.batches.split(","))
        if not batches or batches[0] < 1:
            ap.error(f"--batches: expected batch sizes >= 1, got {a.batches!r}")
        dev = torch.device("cuda")
        sms = torch.cuda.get_device_properties(dev).multi_processor_count
        raw = {"gpu": torch.cuda.get_device_name(dev), "sms": sms, "L": a.L, "records": []}

        def write(records: list[dict]) -> None:  # after every record: a run stopped by a time limit keeps them
            raw["records"] = records
            Path(a.output).write_text(json.dumps(raw, indent=1))

        setup = "served" if a.served_launch else "after-conv" if a.after_conv else "chained"
        measure(a.families.split(","), [m for m in a.models.split(",") if m] or None, a.specs.split(","), batches,
                device_of(dev).arch, lambda shape, label, b, mode: time_mode(shape, label, b, mode, a.L, dev, setup),
                write, SETUPS[setup][2])
    found = entries_from(raw["records"], raw["gpu"], raw["sms"])
    for e in found:
        print(f"{e.family} {e.state} {e.arch} launch {e.launch}: replay from {e.min_work_per_sm} work items per SM, "
              f"fused from {e.fused_min_work_per_sm}")
    if a.write_table:
        entries = {(c.family, c.state, c.arch, c.launch): c for c in crossovers.shipped()}
        entries.update({(c.family, c.state, c.arch, c.launch): c for c in found})
        table = json.loads(crossovers.TABLE.read_text())
        table["entries"] = [vars(c) for c in entries.values()]
        crossovers.TABLE.write_text(json.dumps(table, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
