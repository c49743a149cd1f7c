"""Compile the kernel modules of model presets x state specs (bf16 activations) on every core before a benchmark
runs them (development: a benchmark compiles each module on first use, one at a time, which dominates a fresh GPU
machine's time). Run it with the tree to compile first on PYTHONPATH; cubins are keyed by their sources.

    python3 benchmarks/dev/precompile_specs.py --models nemotron-3-super-120b,qwen3.5-4b --specs fp32,nvfp4
"""
from __future__ import annotations

import argparse
import sys
import time

import torch

from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import parse_state_label, torch_dtype
from trtllm_replayssm.core.jit.compiler import compile_all
from trtllm_replayssm.core.jit.configs import KernelConfig, unique
from trtllm_replayssm.lab.bench.shapes import shape_from_preset


def spec_kernel_configs(models: list[str], labels: list[str]) -> list[KernelConfig]:
    """Every module the layers of ``models`` can launch with each state spec of ``labels``."""
    configs = []
    for model in models:
        dims = shape_from_preset(model).dims
        for label in labels:
            spec = parse_state_label(label, "--specs")
            state = spec if spec.stored else torch_dtype(spec.format, "state")
            configs += family_of(dims).kernel_configs(dims, state, torch.bfloat16)
    return unique(configs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="comma-separated model presets")
    ap.add_argument("--specs", required=True, help="comma-separated state specs (fp32, nvfp4, nvfp4/dual/fp16, ...)")
    ap.add_argument("--arch", default="sm_90a")
    args = ap.parse_args(argv)
    configs = spec_kernel_configs(args.models.split(","), args.specs.split(","))
    start = time.time()
    compile_all(configs, args.arch)
    print(f"{len(configs)} kernel modules for {args.arch} in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
