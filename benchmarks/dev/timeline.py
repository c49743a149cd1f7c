"""Per-CTA timeline of the GDN replay step inside the bench's CUDA graph (development only).

  PYTHONPATH=. python3 benchmarks/dev/timeline.py qwen3.5-4b fp32 256 /tmp/traced/plugins [OUT.npz]

Kernel sources patched by benchmarks/dev/timeline_patch.py. Times the replay like plan_sweep.py, traces the last two
pools' steps of one more graph replay and prints percentiles (µs from the first prep CTA's start) of prep CTA start /
end, main CTA start / producer past `griddepcontrol.wait` / end, the gap from the previous step's main kernel, and
the raw arrays to OUT.npz. Used for docs/benchmarks.md "Session 9".
"""
import sys
from pathlib import Path
import numpy as np, torch
from trtllm_replayssm.lab.bench import kernels, ours, timing
from trtllm_replayssm.lab.bench.shapes import shape_from_preset
from trtllm_replayssm.core.jit import compiler, loader

model, sd, batch, src = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
compiler.PLUGIN_DIR = src
loader._MODULES.clear()
dev = torch.device("cuda", 0)
drv = loader._driver()
shape = shape_from_preset(model)
if shape.family != "gdn":  # the prep grid below is one CTA per 4 (row, key head) items
    sys.exit(f"timeline.py: a GDN preset, got {model} ({shape.family})")
gen, step, pools = kernels.case_inputs(shape, sd, batch, timing.l2_bytes(dev), dev)
case = ours.replay_case(shape, batch, sd, step, pools, 16, "replay", gen, dev)
calls = [f for _ in range(16) for f in case.calls]
us = timing.time_calls(calls)
print(f"{model} {sd} b={batch} pools={pools}: replay {us:.1f} us (graph median)")
def layer_of(fn):
    for cell in fn.__closure__:
        if hasattr(cell.cell_contents, "cursor"):
            return cell.cell_contents
mods = [m for (cfg, _), (m, f) in loader._MODULES.items() if "delta_replay_main_kernel" in f]
assert len(mods) == 1, len(mods)
mod = mods[0]
def glob(name):
    ptr, size = loader._check(drv.cuModuleGetGlobal(mod, name.encode()), name)
    return int(ptr), size
kp, _ = glob("g_trace_key"); pp, ps = glob("g_prep_trace"); mp, ms = glob("g_main_trace")
keys = np.array([layer_of(case.calls[pools - 2]).cursor.data_ptr(), layer_of(case.calls[pools - 1]).cursor.data_ptr()], dtype=np.uint64)
prep_ctas = (batch * shape.key_heads + 3) // 4
def run_once():
    torch.cuda.synchronize()
    loader._check(drv.cuMemcpyHtoD(kp, keys.ctypes.data, 16), "key")
    loader._check(drv.cuMemsetD8(pp, 0, ps), "z"); loader._check(drv.cuMemsetD8(mp, 0, ms), "z")
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        for fn in calls: fn()  # warm (eager) then captured
    torch.cuda.synchronize()
    with torch.cuda.graph(g):
        for fn in calls: fn()
    g.replay(); torch.cuda.synchronize()
    loader._check(drv.cuMemsetD8(pp, 0, ps), "z"); loader._check(drv.cuMemsetD8(mp, 0, ms), "z")
    g.replay(); torch.cuda.synchronize()
    P = np.zeros((2, 4096, 3), dtype=np.uint64); M = np.zeros((2, 1024, 4), dtype=np.uint64)
    loader._check(drv.cuMemcpyDtoH(P.ctypes.data, pp, ps), "P"); loader._check(drv.cuMemcpyDtoH(M.ctypes.data, mp, ms), "M")
    return P, M
P, M = run_once()
for gen_i in (0, 1):
    p = P[gen_i, :prep_ctas].astype(np.int64); m = M[gen_i]; m = m[m[:, 0] > 0].astype(np.int64)
    t0 = p[:, 0].min()
    q = lambda a: " ".join(f"{np.percentile(a, x):6.2f}" for x in (0, 10, 50, 90, 100))
    print(f"-- step of pool {pools - 2 + gen_i}: times in us from first prep CTA start (pct 0/10/50/90/100)")
    print(f" prep start   {q((p[:, 0] - t0) / 1e3)}   ({len(p)} CTAs)")
    print(f" prep end     {q((p[:, 1] - t0) / 1e3)}")
    print(f" main start   {q((m[:, 0] - t0) / 1e3)}   ({len(m)} CTAs)")
    print(f" main waited  {q((m[:, 1] - t0) / 1e3)}")
    print(f" main end     {q((m[:, 2] - t0) / 1e3)}")
    if gen_i == 0:
        prev_end = m[:, 2].max()
    else:
        print(f" gap prev main end -> this prep start: {(t0 - prev_end) / 1e3:.2f} us")
    # per-SM: when did the first main CTA start vs last prep CTA end on that SM
    sm_prep_end = {}
    for row in p: sm_prep_end[row[2]] = max(sm_prep_end.get(row[2], 0), row[1])
    d = [(r[0] - sm_prep_end.get(r[3], r[0])) / 1e3 for r in m]
    print(f" main start - last prep end on its SM: {q(np.array(d))}")
np.savez(sys.argv[5] if len(sys.argv) > 5 else "/tmp/trace.npz", P=P, M=M)
