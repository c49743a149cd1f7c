"""Mamba-2, GDN and KDA decode speed on quantized, dual-copy and plain checkpoints (H200), per state spec and batch.

Protocol (docs/benchmarks.md): copy ceiling in the same run; cold L2 by rotating independent caches whose total exceeds
4x L2, all in one CUDA graph; medians of 15 graph replays. Phases: ``cycle`` = L steps per cache from staggered
cursors (every row flushes once: whole cycles), ``nonflush`` = one step per cache with cursors staggered over
0 .. L-2; the cursors are reset outside the timed region before each replay. A plan in flush mode keeps its cursors
at 0 instead (its steady state: every step flushes an empty ring, as in ``bench kernels``; a reset would fold each
row's staggered ring once per replay). ``baseline``: the state-update kernel (read and write the checkpoint, the
master in dual mode, every step). Writes JSON records with the results schema of docs/benchmarks.md.

    python3 benchmarks/dev/quant_speed.py -o benchmarks/results/quant-speed-h200.json
"""
from __future__ import annotations

import argparse
import json
import sys

import torch

from trtllm_replayssm.core import byte_model
from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import parse_state_label
from trtllm_replayssm.core.plans import Tuning
from trtllm_replayssm.core.samples import slot_indices
from trtllm_replayssm.lab.bench import timing
from trtllm_replayssm.lab.bench.ours import fill_layer_
from trtllm_replayssm.lab.bench.shapes import shape_from_preset

SPECS = ["fp32", "bf16", "fp8", "nvfp4", "fp8/dual/fp32", "nvfp4/dual/fp16", "nvfp4/dual/fp32", "nvfp4/dual/fp16+sr"]
MODELS = ["nemotron-3-super-120b", "nemotron-3-nano-4b", "qwen3.5-4b", "kimi-linear-48b"]


def _layers(shape, spec, batch, L, n, gen, dev, nonflush):
    """``n`` single-layer caches with random stored checkpoints and staggered cursors (over 0 .. L-2 for the
    non-flush phase), each with its batch's slot ids and its initial cursors."""
    fam = family_of(shape.dims)
    out = []
    for _ in range(n):
        layer = fam.new_cache(shape.dims, 1, batch + 1, buffer_len=L, state_dtype=spec, device=dev).layer(0)
        idx = slot_indices(batch, gen, dev)
        fill_layer_(layer, shape, idx, L, gen, L - 1 if nonflush else L)
        out.append((layer, idx, layer.cursor.clone()))
    return out


def measure(model, label, batch, phase, L, dev, gen, ceiling, impl, tuning=Tuning(), mode=None):
    """One record; ``mode``: the replay op's mode (None: ``replay`` from 8 work items per SM, else ``auto``)."""
    shape = shape_from_preset(model)
    spec = parse_state_label(label)
    fam = family_of(shape.dims)
    step = fam.random_step(shape.dims, batch, gen, dev)
    args, kwargs = step.op_args()
    out = torch.empty(batch, shape.dims.heads, shape.dims.rows, dtype=torch.bfloat16, device=dev)
    per_cache = byte_model.state_bytes(shape.dims, spec) * (batch + 1)
    n = timing.pools_for_cold_l2(per_cache, timing.l2_bytes(dev))
    layers = _layers(shape, spec, batch, L, n, gen, dev, phase == "nonflush")
    if impl == "baseline":
        if spec.stochastic_rounding:
            return None
        states = [lay.checkpoint() if lay.storage is not None else lay.state for lay, _, _ in layers]
        plans = [fam.state_update_plan(st, batch, args[0].dtype, tuning) for st in states]
        calls = [lambda st=st, idx=idx, plan=plan: fam.state_update(st, *args, **kwargs, state_batch_indices=idx,
                                                                     out=out, plan=plan)
                 for st, (_, idx, _), plan in zip(states, layers, plans)]
        mode, steps = "baseline", 1
        model_bytes = byte_model.baseline_bytes(shape.dims, spec, "bf16")
    else:
        if mode is None:
            sms = torch.cuda.get_device_properties(dev).multi_processor_count
            mode = "replay" if batch * shape.dims.heads >= 8 * sms else "auto"
        plans = [fam.replay_plan(lay, batch, mode, tuning) for lay, _, _ in layers]
        steps = 1 if phase == "nonflush" else L
        calls = [lambda lay=lay, idx=idx, plan=plan: fam.replay_decode(lay, *args, **kwargs, state_batch_indices=idx,
                                                                       out=out, plan=plan)
                 for _ in range(steps) for (lay, idx, _), plan in zip(layers, plans)]
        mode = plans[0].mode
        if mode == "flush":  # every step reads and writes the checkpoint: the baseline's bytes (docs/benchmarks.md)
            model_bytes = byte_model.baseline_bytes(shape.dims, spec, "bf16")
        else:
            model_bytes = (byte_model.nonflush_bytes if phase == "nonflush" else byte_model.replay_bytes)(
                shape.dims, spec, "bf16", L)

    def reset():
        for lay, _, cursor in layers:
            lay.cursor.copy_(cursor)

    us = timing.time_calls(calls, before_each=None if mode == "flush" else reset)
    gbps = model_bytes * batch / (us * 1e-6) / 1e9
    rec = {"family": fam.name, "model": model, "impl": impl, "batch": batch, "L": L, "median_us": us,
           "model_gbps": gbps, "copy_ceiling_gbps": ceiling, "pct_of_ceiling": 100 * gbps / ceiling,
           **spec.to_dict(), "state_dtype": spec.checkpoint_format.name, "phase": phase if impl == "replay" else "step",
           "mode": mode, "rows_per_cta": plans[0].rows_per_cta,
           "tail_fraction": plans[0].record().get("tail_fraction") if impl == "replay" else None,
           "stages": plans[0].stages if impl == "replay" else None,
           "fold_bytes": plans[0].fold_bytes if impl == "replay" else None,
           "flush_ctas": plans[0].flush_ctas if impl == "replay" else None,
           "flush_rows_per_cta": (plans[0].flush_rows_per_cta or plans[0].rows_per_cta) if impl == "replay" else None,
           "grid": plans[0].grid[0] if impl == "replay" else None,
           "programmatic": plans[0].programmatic,
           "device": torch.cuda.get_device_name(dev)}
    del layers, calls
    torch.cuda.empty_cache()
    return rec


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--batches", default="1,8,256")
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--specs", default=",".join(SPECS))
    ap.add_argument("-L", type=int, default=16)
    ap.add_argument("--rows-per-cta", default="", help="row tiles to try besides the planner's, e.g. 32,64")
    ap.add_argument("--tail-fractions", default="", help="claimed-tail shares to try besides the planner's, e.g. 0.5,1")
    ap.add_argument("--stages", default="", help="shared-memory stage counts to try besides the planner's, e.g. 4")
    ap.add_argument("--stored-ctas", default="", help="main-kernel CTAs per SM on stored checkpoints to try besides "
                    "the planner's, e.g. 3,5")
    ap.add_argument("--flush-apart", default="", help="Mamba-2 flush rows apart (1) or in the persistent kernel (0) "
                                                      "to try besides the planner's choice, e.g. 0,1")
    ap.add_argument("--flush-ctas", default="", help="flush-rows kernel CTAs per SM to try besides the default, e.g. 4")
    ap.add_argument("--flush-rows-per-cta", default="", help="GDN/KDA flush-rows kernel row tiles to try besides the "
                                                             "main kernel's, e.g. 32,64")
    ap.add_argument("--plain-state-launch", action="store_true",
                    help="also time the state kernels launched plainly (not as programmatic dependents)")
    ap.add_argument("--impls", default="replay,baseline")
    ap.add_argument("--phases", default="cycle,nonflush", help="replay phases to time")
    ap.add_argument("--modes", default="", help="replay op modes to time (e.g. fused,flush); default: replay from 8 "
                                                "work items per SM, else auto")
    a = ap.parse_args()
    dev = torch.device("cuda")
    ceiling = timing.copy_ceiling_gbps(dev)
    gen = torch.Generator().manual_seed(0)
    records = []
    tilings = [Tuning()] + [Tuning(rows_per_cta=int(t)) for t in a.rows_per_cta.split(",") if t]
    tilings += [Tuning(tail_fraction=float(f)) for f in a.tail_fractions.split(",") if f]
    tilings += [Tuning(stages=int(n)) for n in a.stages.split(",") if n]
    tilings += [Tuning(stored_ctas_per_sm=int(n)) for n in a.stored_ctas.split(",") if n]
    tilings += [Tuning(flush_apart=v == "1") for v in a.flush_apart.split(",") if v]
    tilings += [Tuning(flush_ctas_per_sm=int(n)) for n in a.flush_ctas.split(",") if n]
    tilings += [Tuning(flush_rows_per_cta=int(n)) for n in a.flush_rows_per_cta.split(",") if n]
    tilings += [Tuning(programmatic_state=False)] if a.plain_state_launch else []
    for model in a.models.split(","):
        for batch in map(int, a.batches.split(",")):
            for label in a.specs.split(","):
                modes = [m for m in a.modes.split(",") if m] or [None]
                runs = [("replay", ph, t, m) for ph in a.phases.split(",") for m in modes for t in tilings]
                runs += [("baseline", "step", t, None) for t in tilings]
                for impl, phase, tuning, mode in [r for r in runs if r[0] in a.impls.split(",")]:
                    try:
                        rec = measure(model, label, batch, phase, a.L, dev, gen, ceiling, impl, tuning, mode)
                    except Exception as exc:  # report and go on: one failing case must not hide the others
                        print(f"FAIL {model} {label} b{batch} {impl} {phase}: {exc}", file=sys.stderr)
                        continue
                    if rec is None:
                        continue
                    records.append(rec)
                    with open(a.output, "w") as f:  # after every case: a run stopped by a time limit keeps its cases
                        json.dump({"copy_ceiling_gbps": ceiling, "records": records}, f, indent=1)
                    print(f"{model:24s} {label:20s} b{batch:<4d} {impl:8s} {rec['phase']:8s} {rec['mode']:8s} "
                          f"pt{rec['rows_per_cta']} tail{rec['tail_fraction']} st{rec['stages']} fold{rec['fold_bytes']} "
                          f"apart{rec['flush_ctas']}/{rec['flush_rows_per_cta']} grid{rec['grid']} "
                          f"pdl{int(rec['programmatic'])} {rec['median_us']:9.1f} us {rec['pct_of_ceiling']:5.1f}%",
                          flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
