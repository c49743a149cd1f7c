"""Replay steps of a model's kernels (default: Nemotron-3-Super's Mamba-2) on a stored checkpoint, eagerly, for Nsight Compute (development only).
Cursors staggered as in quant_speed.py (``cycle``: whole cycles, ``nonflush``: no flush rows, ``flush``: every row
flushes); each cache steps once to warm up, then STEPS more inside the NVTX range "profile".
  ncu --clock-control none --nvtx --nvtx-include "profile/" python3 benchmarks/dev/ncu_quant.py SPEC PHASE [BATCH] [STEPS] [MODEL]
"""
import sys

import torch

from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import parse_state_label
from trtllm_replayssm.core.samples import slot_indices
from trtllm_replayssm.lab.bench.ours import fill_layer_
from trtllm_replayssm.lab.bench.shapes import shape_from_preset

label, phase = sys.argv[1], sys.argv[2]
batch = int(sys.argv[3]) if len(sys.argv) > 3 else 256
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 2
L, dev = 16, torch.device("cuda")
gen = torch.Generator().manual_seed(0)
shape = shape_from_preset(sys.argv[5] if len(sys.argv) > 5 else "nemotron-3-super-120b")
spec = parse_state_label(label)
fam = family_of(shape.dims)
layer = fam.new_cache(shape.dims, 1, batch + 1, buffer_len=L, state_dtype=spec, device=dev).layer(0)
idx = slot_indices(batch, gen, dev)
fill_layer_(layer, shape, idx, L, gen, {"cycle": L, "nonflush": L - 1, "flush": 1}[phase])
if phase == "flush":
    layer.cursor[idx.long()] = L - 1
step = fam.random_step(shape.dims, batch, gen, dev)
args, kwargs = step.op_args()
out = torch.empty(batch, shape.dims.heads, shape.dims.rows, dtype=torch.bfloat16, device=dev)
plan = fam.replay_plan(layer, batch, "replay")
cursor = layer.cursor.clone()


def call():
    layer.cursor.copy_(cursor)
    fam.replay_decode(layer, *args, **kwargs, state_batch_indices=idx, out=out, plan=plan)


call()
torch.cuda.synchronize()
torch.cuda.nvtx.range_push("profile")
for _ in range(steps):
    call()
torch.cuda.nvtx.range_pop()
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
start.record()
for _ in range(20):
    call()
end.record()
torch.cuda.synchronize()
print(f"{label} {phase} b{batch}: plan {plan.record()}, {start.elapsed_time(end) / 20 * 1e3:.1f} us/step (warm L2)")
