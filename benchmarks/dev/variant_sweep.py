"""Replay-kernel variant sweep at one batch (development only): for each case, our replay with a row tile, a
(CTAs per SM, stages) plan and a compile-time VARIANT of the main kernel, timed with the bench protocol (cold-L2 pools,
CUDA graph over whole L-cycles, staggered cursors, medians) next to our baseline.
VARIANT (only in development builds): 0 shipped; 1 consumers release each stage at once (streaming alone); 2 flush
tiles computed like non-flush ones (no fold); 3 no warp reductions in the main kernel; 5 main kernel returns at once.
Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/variant_sweep.py CASES_JSON
CASES_JSON: [[model, state_dtype, batch, tile|null, [ctas, stages]|null, variant(, fold buffer: true|false|null)], ...]"""
import dataclasses
import json
import sys
import zlib

import torch

from trtllm_replayssm.bench import byte_model, inputs, ours, timing
from trtllm_replayssm.bench.shapes import shape_from_preset
from trtllm_replayssm.ops import _launch
from trtllm_replayssm.ops import gdn as gdn_ops
from trtllm_replayssm.ops import mamba2 as m2_ops

VARIANT = [0]


def _with_variant(make):
    def wrapped(*args):
        cfg = make(*args)
        return dataclasses.replace(cfg, params=cfg.params + (("variant", VARIANT[0]),)) if VARIANT[0] else cfg
    return wrapped


m2_ops.mamba2_config = _with_variant(m2_ops.mamba2_config)
gdn_ops.gdn_config = _with_variant(gdn_ops.gdn_config)
gdn_ops.kda_config = _with_variant(gdn_ops.kda_config)

dev = torch.device("cuda", 0)
ceil = timing.copy_ceiling_gbps(dev)
l2 = timing.l2_bytes(dev)
print(f"copy ceiling {ceil:.0f} GB/s", flush=True)
base_cache = {}
for model, sd, batch, tile, plan, variant, *fold in json.loads(sys.argv[1]):
    _launch.FOLD_BUFFER_OVERRIDE = fold[0] if fold else None
    shape = shape_from_preset(model)
    gen = torch.Generator().manual_seed(zlib.crc32(f"{model}/{sd}/{batch}".encode()))
    step = (inputs.mamba2_step if shape.family == "mamba2" else inputs.delta_step)(shape, batch, gen, dev)
    pools = timing.pools_for_cold_l2((batch + 1) * byte_model.state_bytes(shape, sd), l2)
    ops = m2_ops if shape.family == "mamba2" else gdn_ops
    if (model, sd, batch) not in base_cache:
        ops.ROWS_PER_CTA_OVERRIDE, _launch.PERSISTENT_OVERRIDE, VARIANT[0] = None, None, 0
        case = ours.baseline_case(shape, batch, sd, step, pools, gen, dev)
        base_cache[(model, sd, batch)] = timing.time_calls([f for _ in range(16) for f in case.calls])
        del case
    base = base_cache[(model, sd, batch)]
    ops.ROWS_PER_CTA_OVERRIDE, _launch.PERSISTENT_OVERRIDE, VARIANT[0] = tile, tuple(plan) if plan else None, variant
    try:
        case = ours.replay_case(shape, batch, sd, step, pools, 16, "replay", gen, dev)
        us = timing.time_calls([f for _ in range(16) for f in case.calls])
    except Exception as exc:  # report and go on
        print(f"{model} {sd} b={batch} tile={tile} plan={plan} v={variant} fold={fold}: FAIL {type(exc).__name__}: {exc}", flush=True)
        continue
    gbps = batch * byte_model.step_bytes("replay", shape, sd, 16, "replay") / (us * 1e-6) / 1e9
    print(f"{model:22s} {sd} b={batch} tile={tile} plan={plan} v={variant} fold={fold}: replay {us:7.1f} us "
          f"({100 * gbps / ceil:4.1f}% copy) baseline {base:7.1f} us x{base / us:.3f}", flush=True)
    del case
    torch.cuda.empty_cache()
