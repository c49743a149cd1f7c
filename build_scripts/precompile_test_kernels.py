#!/usr/bin/env python3
"""Compile the kernel modules the GPU test files name at module level, on every core, before pytest runs them.

pytest compiles a module on its first use, one at a time per process, which dominates a fresh GPU machine's test
time. This script imports the GPU test modules and collects, per module, the SSM dims and state specs their globals
hold (directly or inside dicts, lists and tuples); every family module those dims can launch with those specs and an
fp32 checkpoint, bf16 activations, is compiled into the kernel cache (NVRTC releases the GIL: one thread per core).
Dims a test builds inside a function are not seen; their modules compile on first use as before. With ``--models``
and ``--specs`` it compiles the modules of those model presets x state specs instead, before a benchmark runs them;
``--families`` keeps the modules of those kernel families only (a GPU call that tests one family's change).

    python3 build_scripts/precompile_test_kernels.py [--arch sm_90a] [--list] [--models M,... --specs S,...]
        [--families mamba2,gdn,kda,spec]
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from trtllm_replayssm.core.dims import SSMDims
from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import StateSpec, state_spec, torch_dtype
from trtllm_replayssm.core.jit.configs import KernelConfig, unique
from trtllm_replayssm.serving.catalog import label_configs

TESTS = Path(__file__).resolve().parents[1] / "tests"
GPU_TEST_MODULES = ("test_quantized_gpu", "test_row_contract", "test_properties", "test_mamba2_gpu",
                    "test_gdn_kda_gpu", "test_speculative_gpu", "test_speculative_delta_gpu")


def _found(value: object, depth: int = 0) -> Iterator[SSMDims | StateSpec]:
    if isinstance(value, (SSMDims, StateSpec)):
        yield value
    elif depth < 2 and isinstance(value, (dict, list, tuple)):
        for item in (value.values() if isinstance(value, dict) else value):
            yield from _found(item, depth + 1)


def gpu_test_kernel_configs(modules: tuple[str, ...] = GPU_TEST_MODULES) -> list[KernelConfig]:
    """The modules of each test module's dims x (its specs and fp32), bf16 activations."""
    if str(TESTS) not in sys.path:
        sys.path.insert(0, str(TESTS))
    configs = []
    for name in modules:
        dims, specs = set(), {state_spec("fp32")}
        for value in vars(importlib.import_module(name)).values():
            for item in _found(value):
                (dims if isinstance(item, SSMDims) else specs).add(item)
        for d in dims:
            for spec in specs:
                state = spec if spec.stored else torch_dtype(spec.format, "state")
                configs += family_of(d).kernel_configs(d, state, torch.bfloat16)
    return unique(configs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="sm_90a", help="target SM (default sm_90a: H100/H200)")
    parser.add_argument("--list", action="store_true", help="print the module names only")
    parser.add_argument("--models", default="", help="comma-separated model presets (with --specs)")
    parser.add_argument("--specs", default="", help="comma-separated state specs (with --models)")
    parser.add_argument("--families", default="", help="comma-separated kernel families to keep (default: all)")
    args = parser.parse_args(argv)
    if bool(args.models) != bool(args.specs):
        parser.error("--models and --specs: give both or neither")
    configs = (label_configs(args.models.split(","), args.specs.split(","), "--specs") if args.models
               else gpu_test_kernel_configs())
    if args.families:
        families = args.families.split(",")
        unknown = sorted(set(families) - {c.family for c in configs})
        if unknown:
            parser.error(f"--families: no module of {unknown} here; expected some of "
                         f"{sorted({c.family for c in configs})}")
        configs = [c for c in configs if c.family in families]
    if args.list:
        print("\n".join(c.name for c in configs))
        return 0
    from trtllm_replayssm.core.jit.compiler import compile_all

    start = time.time()
    compile_all(configs, args.arch)
    print(f"{len(configs)} kernel modules for {args.arch} in {time.time() - start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
