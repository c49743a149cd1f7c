"""Replay launch-plan sweep at one batch (development only): for each case, our replay with a row tile, a
(CTAs per SM, stages) plan and the fold buffer forced off or left to the plan, timed with the bench protocol (cold-L2
pools, CUDA graph over whole L-cycles, staggered cursors, medians) next to our baseline.
Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/plan_sweep.py CASES_JSON
CASES_JSON: [[model, state_dtype, batch, tile|null, [ctas, stages]|null(, fold buffer enabled: true|false(, mode(,
plugins(, settings))))], ...] (mode: the replay op's mode, default "replay"; "auto" / "flush" time the adaptive
small-batch path; plugins: a directory of kernel sources to compile instead of plugins/, for A/B runs of kernel
variants in one process; settings: {"gdn.NAME", "mamba2.NAME" or "launch.NAME": value} module settings of ops.gdn /
ops.mamba2 / ops._launch, kept for later cases; session-11 logs set launch.TAIL_FRACTION, since then gdn. / mamba2.)
(The logs benchmarks/results/dev/sweep-*.log also name a compile-time VARIANT of the main kernel: temporary hooks of
the development commit f9af46f, removed since: 1 consumers release each stage at once (streaming alone), 2 flush tiles
computed like non-flush ones (no fold, no checkpoint write), 3 no warp reductions, 5 main kernel returns at once.)"""
import json
import sys
from pathlib import Path

import torch

from trtllm_replayssm.lab.bench import byte_model, kernels, ours, timing
from trtllm_replayssm.lab.bench.shapes import shape_from_preset
from trtllm_replayssm.core.jit import compiler, loader
from trtllm_replayssm.core.jit.configs import dtype_from_name
from trtllm_replayssm.core.ops import launch as _launch
from trtllm_replayssm.core.ops import gdn as gdn_ops
from trtllm_replayssm.core.ops import mamba2 as m2_ops

dev = torch.device("cuda", 0)
ceil = timing.copy_ceiling_gbps(dev)
l2 = timing.l2_bytes(dev)
print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
base_cache = {}
for model, sd, batch, tile, plan, *extra in json.loads(sys.argv[1]):
    fold = extra[0] if extra else True
    mode = extra[1] if len(extra) > 1 else "replay"
    plugins = Path(extra[2]) if len(extra) > 2 and extra[2] else Path(__file__).resolve().parents[2] / "plugins"
    settings = extra[3] if len(extra) > 3 else {}
    tag = " ".join(f"{k.split('.')[1]}={v}" for k, v in settings.items())
    for key, value in settings.items():
        module, name = key.split(".")
        setattr({"gdn": gdn_ops, "mamba2": m2_ops, "launch": _launch}[module], name, value)
    if plugins.resolve() != compiler.PLUGIN_DIR.resolve():
        compiler.PLUGIN_DIR = plugins
        loader._MODULES.clear()  # modules are keyed by config only
    _launch.FOLD_BUFFER_ENABLED = fold
    shape = shape_from_preset(model)
    gen, step, pools = kernels.case_inputs(shape, sd, batch, l2, dev)
    ops = m2_ops if shape.family == "mamba2" else gdn_ops
    if (model, sd, batch) not in base_cache:
        ops.ROWS_PER_CTA_OVERRIDE, _launch.PERSISTENT_OVERRIDE = None, None
        case = ours.baseline_case(shape, batch, sd, step, pools, gen, dev)
        base_cache[(model, sd, batch)] = timing.time_calls([f for _ in range(16) for f in case.calls])
        del case
    base = base_cache[(model, sd, batch)]
    ops.ROWS_PER_CTA_OVERRIDE, _launch.PERSISTENT_OVERRIDE = tile, tuple(plan) if plan else None
    try:
        case = ours.replay_case(shape, batch, sd, step, pools, 16, mode, gen, dev)
        us = timing.time_calls([f for _ in range(16) for f in case.calls])
    except Exception as exc:  # report and go on
        print(f"{model} {sd} b={batch} tile={tile} plan={plan} fold={fold} mode={mode} src={plugins.parent.name} {tag}: FAIL {type(exc).__name__}: {exc}",
              flush=True)
        continue
    flush = _launch.force_flush_for(shape.family, mode, batch, shape.heads, dtype_from_name(sd), dev)
    gbps = batch * byte_model.step_bytes("replay", shape, sd, 16, "flush" if flush else "replay") / (us * 1e-6) / 1e9
    print(f"{model:22s} {sd} b={batch} tile={tile} plan={plan} fold={fold} mode={mode} src={plugins.parent.name} {tag}: replay {us:7.1f} us "
          f"({100 * gbps / ceil:4.1f}% copy) baseline {base:7.1f} us x{base / us:.3f}", flush=True)
    del case
    torch.cuda.empty_cache()
