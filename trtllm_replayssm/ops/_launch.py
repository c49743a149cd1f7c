"""Launch-side helpers shared by the ops: device facts, adaptive mode, row-tile choice, ctypes parameter structs."""
from __future__ import annotations

import ctypes
import functools
import os

import torch

from trtllm_replayssm.kernels.configs import rows_per_cta_choices, tile_choices


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def adaptive_threshold(device: torch.device) -> int:
    """Work items (batch x heads) below which ``mode='auto'`` flushes every step (baseline traffic, no ring)."""
    env = os.environ.get("TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD")
    if env is not None:
        return int(env)
    # Measured on the H200 (benchmarks/results): the replay's two launches cost more than they save below ~8 x SMs
    # (batch x heads), e.g. Nemotron-3-Nano-4B (96 heads) at batch 8.
    return 8 * sm_count(device.index if device.index is not None else torch.cuda.current_device())


def force_flush_for(mode: str, batch: int, heads: int, device: torch.device) -> bool:
    if mode == "flush":
        return True
    if mode == "replay" or device.type != "cuda":
        return False
    return batch * heads < adaptive_threshold(device)


def rows_per_cta(rows: int, cols: int, work_items: int, device: torch.device, override: int | None = None) -> int:
    """Row tile for a (rows x cols) state per head: fill the GPU at small batch, big tiles at large batch."""
    choices = tile_choices(rows, cols)
    if override is not None:
        if override not in rows_per_cta_choices(rows):
            raise ValueError(f"rows_per_cta: expected one of {rows_per_cta_choices(rows)}, got {override}")
        return override
    # Enough CTAs for ~24 per SM (measured best at batch 8 and 64 on the H200); large batches take the largest tile.
    target_ctas = 24 * sm_count(device.index if device.index is not None else torch.cuda.current_device())
    fitting = [t for t in choices if work_items * (rows // t) >= target_ctas]
    return max(fitting) if fitting else min(choices)


def ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def stride(t: torch.Tensor | None, dim: int) -> int:
    return 0 if t is None else t.stride(dim)


def make_struct(name: str, fields: list[tuple[str, type]]) -> type[ctypes.Structure]:
    """A ctypes mirror of a kernel's by-value parameter struct (natural alignment, as in the C++ struct)."""
    return type(name, (ctypes.Structure,), {"_fields_": fields})
