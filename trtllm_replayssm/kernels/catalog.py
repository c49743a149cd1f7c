"""The kernel modules the toolkit ships: every preset's configs for the supported state/activation dtypes."""
from __future__ import annotations

import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import torch

from trtllm_replayssm.kernels.compiler import CompiledKernel, compile_config
from trtllm_replayssm.kernels.configs import KernelConfig, configs_for_spec, decoder_layers_config, unique

# (state dtype, activation dtype) pairs compiled ahead of time.
DTYPE_PAIRS: tuple[tuple[torch.dtype, torch.dtype], ...] = (
    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.float32, torch.float16),
)


def catalog_configs(presets: Iterable[str] | None = None,
                    dtype_pairs: Iterable[tuple[torch.dtype, torch.dtype]] = DTYPE_PAIRS) -> list[KernelConfig]:
    """Configs of the named presets (default: all) for each (state, activation) dtype pair."""
    from trtllm_replayssm.presets import get_preset, list_presets

    names = list(presets) if presets is not None else list_presets()
    unknown = [n for n in names if n.strip().lower() not in list_presets()]
    if unknown:
        raise ValueError(f"presets: unknown preset {unknown}; expected names from {list_presets()}")
    pairs = list(dtype_pairs)
    return unique(cfg for name in names for state, act in pairs
                  for cfg in configs_for_spec(get_preset(name), state, act))


def decoder_layer_configs() -> list[KernelConfig]:
    """The reference decoders' fused layer kernels for every activation dtype (compiled on first use; CI gate)."""
    return [decoder_layers_config(dtype) for dtype in (torch.bfloat16, torch.float16, torch.float32)]


@dataclass(frozen=True)
class ResourceUsage:
    """Per-kernel numbers ptxas printed into the NVRTC log."""

    kernel: str
    registers: int
    spill_bytes: int
    stack_bytes: int


def resource_usage(log: str) -> list[ResourceUsage]:
    """Parse ``-Xptxas -v`` output: registers, spill stores+loads and stack frame per entry function."""
    usage, current, stack, spills = [], None, 0, 0
    for line in log.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            current = m.group(1)
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            stack, spills = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        elif (m := re.search(r"Used (\d+) registers", line)) and current:
            usage.append(ResourceUsage(current, int(m.group(1)), spills, stack))
            current = None
    return usage


def compile_all(configs: list[KernelConfig], arch: str, out_dir: Path | None = None,
                progress: Callable[[KernelConfig], None] | None = None,
                workers: int | None = None) -> list[CompiledKernel]:
    """Compile (or take from the cache) every config for ``arch`` on ``workers`` threads (default: one per CPU;
    NVRTC releases the GIL); copy cubins to ``out_dir`` as ``<name>.<arch>.cubin`` if given. Results keep the
    order of ``configs``; ``progress`` is called once per finished config."""
    def one(cfg: KernelConfig) -> CompiledKernel:
        result = compile_config(cfg, arch)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(result.cubin_path, out_dir / f"{cfg.name}.{arch}.cubin")
        return result

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        futures = [pool.submit(one, cfg) for cfg in configs]
        try:
            for future in as_completed(futures):
                future.result()
                if progress:
                    progress(future.result().config)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return [f.result() for f in futures]
