"""Structural floors of a small-batch non-flush step (development only): benchmarks/dev/small_batch_probe.cu's three
launch structures (a CTA per tile, a CTA per two tiles, a persistent streaming kernel, a CTA streaming consecutive
tiles of one group after a one-launch replay's prologue) reading a Mamba-2-shaped fp32
checkpoint (Super: 128 heads x 64 x 128 by default) and writing S·C per row, nothing else. Protocol as the bench's:
cold L2 by rotating pools, one CUDA graph, medians; plain launches; the copy ceiling in the same run. Each record is
µs per step and GB/s on the checkpoint bytes; beside them the shipped kernels' times at the same batch say how much of
a step is the structure and how much the rest (ring, inputs, cursor).

Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/small_batch_probe.py OUT.json [--batches 1,2,4,8,16]
    [--heads 128] [--rows 16,32,64] [--ctas-per-sm 1,2,4] [--stages 2,4,8] [--groups 8] [--tiles-per-cta 2,4,8,16]
"""
import argparse
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import torch

from trtllm_replayssm.core.jit.compiler import PLUGIN_DIR, PLUGIN_DIR_ENV
from trtllm_replayssm.core.jit.configs import KernelConfig
from trtllm_replayssm.core.jit.loader import allow_dynamic_shared, get_kernel, launch
from trtllm_replayssm.core.layouts import ParamLayout
from trtllm_replayssm.core.limits import NUM_WARPS
from trtllm_replayssm.lab.bench import timing

PARAMS = ParamLayout("ProbeParams", """
  const float* state;   // [slots][heads][P][128]
  const int* slot_idx;  // [batch]
  const float* C;       // [batch][128]
  float* out;           // [batch][heads][P]
  const int* cursor;    // [slots]
  const float* B_ring;  // [slots][groups][16][128]
  int heads, batch, stages, tiles_per_cta, groups;""")
N, P = 128, 64
KERNELS = ("grid_kernel", "grid_pair_kernel", "persistent_kernel", "group_stream_kernel")
SHARED_PER_SM = 227 * 1024


def probe_config(rows: int) -> KernelConfig:
    return KernelConfig("probe", "small_batch_probe.cu", KERNELS, (("p", P), ("rows", rows)), layouts=(PARAMS,))


def use_probe_sources() -> Path:
    """A directory holding the probe and the shared header, as the kernel compiler's source directory."""
    src_dir = Path(tempfile.mkdtemp(prefix="small_batch_probe."))
    shutil.copy2(PLUGIN_DIR / "replayssm_common.cuh", src_dir)
    shutil.copy2(Path(__file__).with_suffix(".cu"), src_dir)
    os.environ[PLUGIN_DIR_ENV] = str(src_dir)
    return src_dir


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("output")
    ap.add_argument("--batches", default="1,2,4,8,16")
    ap.add_argument("--heads", type=int, default=128)
    ap.add_argument("--rows", default="16,32,64")
    ap.add_argument("--ctas-per-sm", default="1,2,4")
    ap.add_argument("--stages", default="2,4,8")
    ap.add_argument("--groups", type=int, default=8)
    ap.add_argument("--tiles-per-cta", default="2,4,8,16", help="group_stream_kernel: consecutive tiles per CTA")
    a = ap.parse_args()
    src_dir = use_probe_sources()
    dev = torch.device("cuda", 0)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ceiling = timing.copy_ceiling_gbps(dev)
    print(f"copy ceiling {ceiling:.0f} GB/s, {sms} SMs", flush=True)
    records, wrong = [], 0
    threads = 32 * NUM_WARPS
    for batch in map(int, a.batches.split(",")):
        slots = batch + 1
        per_pool = slots * a.heads * P * N * 4
        n = timing.pools_for_cold_l2(per_pool, timing.l2_bytes(dev))
        gen = torch.Generator(device=dev).manual_seed(batch)
        pools = [torch.randn(slots, a.heads, P, N, device=dev, generator=gen) for _ in range(n)]
        idx = [torch.randperm(slots, device=dev, generator=gen)[:batch].to(torch.int32) for _ in range(n)]
        C = torch.randn(batch, N, device=dev, generator=gen)
        out = torch.empty(batch, a.heads, P, device=dev)
        cursor = torch.randint(0, 16, (slots,), device=dev, generator=gen, dtype=torch.int32)
        B_ring = torch.randn(slots, a.groups, 16, N, device=dev, generator=gen)
        ref = torch.einsum("bhpn,bn->bhp", pools[0][idx[0].long()], C)
        ring_of = torch.einsum("bgjn,bn->bgj", B_ring[idx[0].long()], C)
        ring_of = (ring_of * (torch.arange(16, device=dev) <= cursor[idx[0].long()][:, None, None])).sum(-1)
        ring_ref = ref + ring_of.repeat_interleave(a.heads // a.groups, dim=1)[..., None]
        nbytes = batch * a.heads * P * N * 4
        for rows in map(int, a.rows.split(",")):
            config = probe_config(rows)
            tile_bytes = rows * N * 4
            variants = [("grid_kernel", (P // rows, a.heads, batch), threads, 0, 0, 0)]
            if a.heads % 2 == 0:
                variants.append(("grid_pair_kernel", (P // rows, a.heads // 2, batch), threads, tile_bytes, 0, 0))
            for k in map(int, a.ctas_per_sm.split(",")):
                for st in map(int, a.stages.split(",")):
                    if k * st * tile_bytes <= SHARED_PER_SM - k * 1024:
                        variants.append(("persistent_kernel", (sms * k, 1, 1), threads + 32, st * tile_bytes, k, st))
            row_tiles = a.heads * (P // rows)
            group_tiles = row_tiles // a.groups
            for k in map(int, a.tiles_per_cta.split(",")):
                if group_tiles % k:
                    continue  # a CTA's tiles lie in one group
                for st in map(int, a.stages.split(",")):
                    if st <= k and st * tile_bytes <= SHARED_PER_SM - 1024:
                        variants.append(("group_stream_kernel", (row_tiles // k, 1, batch), threads + 32,
                                         st * tile_bytes, k, st))
            for name, grid, block, shared, k, st in variants:
                fn = get_kernel(config, name, dev)
                if shared:
                    allow_dynamic_shared(fn, shared)
                packs = [PARAMS.pack(state=pool.data_ptr(), slot_idx=ix.data_ptr(), C=C.data_ptr(), out=out.data_ptr(),
                                     cursor=cursor.data_ptr(), B_ring=B_ring.data_ptr(), heads=a.heads, batch=batch,
                                     stages=max(st, 1), tiles_per_cta=k, groups=a.groups)
                         for pool, ix in zip(pools, idx)]
                out.fill_(float("nan"))
                launch(fn, grid, (block, 1, 1), packs[0], shared_bytes=shared)
                torch.cuda.synchronize()
                want = ring_ref if name == "group_stream_kernel" else ref
                err = float((out - want).abs().max() / want.abs().max())
                us = timing.time_calls([lambda fn=fn, pk=pk: launch(fn, grid, (block, 1, 1), pk, shared_bytes=shared)
                                        for pk in packs])
                rec = {"kernel": name, "batch": batch, "heads": a.heads, "rows": rows,
                       "ctas_per_sm": k if name == "persistent_kernel" else None,
                       "tiles_per_cta": k if name == "group_stream_kernel" else None, "stages": st,
                       "grid": list(grid), "median_us": us, "gbps": nbytes / us / 1e3, "rel_err": err,
                       "copy_ceiling_gbps": ceiling, "device": torch.cuda.get_device_name(dev)}
                records.append(rec)
                wrong += err > 1e-4
                print(f"b{batch:<3d} rows {rows:3d} {name:18s} k{k} st{st} grid {grid[0] * grid[1] * grid[2]:5d} "
                      f"{us:7.2f} us {rec['gbps']:6.0f} GB/s err {err:.1e}", flush=True)
                with open(a.output, "w") as f:
                    json.dump({"records": records}, f, indent=1)
        del pools
        torch.cuda.empty_cache()
    shutil.rmtree(src_dir)
    if wrong:
        print(f"FAIL: {wrong} cases differ from torch's S·C by more than 1e-4 (relative)", file=sys.stderr)
    return 1 if wrong else 0


if __name__ == "__main__":
    sys.exit(main())
