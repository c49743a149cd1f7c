"""Runs benchmarks/dev/racecheck_protocol.cu (the stage protocol of the persistent replay kernels, race free by
construction) and checks its sums against the CPU, for both copy kinds (bulk copy, 4-byte cp.async), so that
compute-sanitizer racecheck can be run on it beside the kernels' own smoke tests (development only):

  compute-sanitizer --tool racecheck python3 benchmarks/dev/racecheck_protocol.py [--copy bulk|cp.async] [--tiles N]

The kernel is compiled like the shipped ones (NVRTC, the kernel cache) from a copy of plugins/replayssm_common.cuh.
"""
import argparse
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

PARAMS = ParamLayout("ProtocolParams", """
  const float* src;  // [tiles][kTileFloats]
  float* out;        // [grid][kThreads]: each consumer thread's sum over the tiles
  int tiles, stages;""")
TILE_FLOATS, STAGES, GRID = 1024, 2, 4
COPIES = {"bulk": 1, "cp.async": 0}

parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
parser.add_argument("--copy", choices=[*COPIES, "both"], default="both", help="copy kind(s) to run")
parser.add_argument("--tiles", type=int, default=64, help="tiles each block streams through the stage ring")
args = parser.parse_args()
TILES = args.tiles

src_dir = Path(tempfile.mkdtemp(prefix="racecheck_protocol."))
shutil.copy2(PLUGIN_DIR / "replayssm_common.cuh", src_dir)
shutil.copy2(Path(__file__).with_suffix(".cu"), src_dir)
os.environ[PLUGIN_DIR_ENV] = str(src_dir)
dev = torch.device("cuda", 0)
src = torch.randn(TILES, TILE_FLOATS, device=dev)
threads = 32 * NUM_WARPS
per_thread = src.view(TILES, NUM_WARPS, TILE_FLOATS // NUM_WARPS // 32, 32).sum(dim=(0, 2)).reshape(-1).double()
ok = True
for name, bulk in COPIES.items():
    if args.copy not in (name, "both"):
        continue
    config = KernelConfig("protocol", "racecheck_protocol.cu", ("protocol_kernel",), (("bulk", bulk),),
                          layouts=(PARAMS,))
    kernel = get_kernel(config, "protocol_kernel", dev)
    out = torch.full((GRID, threads), float("nan"), device=dev)
    shared = STAGES * (TILE_FLOATS * 4 + 128)  # kStageBytes
    allow_dynamic_shared(kernel, shared)
    launch(kernel, (GRID, 1, 1), (threads + 32, 1, 1),
           PARAMS.pack(src=src.data_ptr(), out=out.data_ptr(), tiles=TILES, stages=STAGES), shared_bytes=shared)
    torch.cuda.synchronize()
    err = float((out.double() - per_thread).abs().max())
    print(f"protocol kernel, {name}: max |sum - CPU sum| = {err:.2e}")
    ok &= err < 1e-3
shutil.rmtree(src_dir)
sys.exit(0 if ok else 1)
