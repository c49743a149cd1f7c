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


# Where ``mode='auto'`` switches from flushing every step (baseline traffic, no ring) to replay, in work items
# (batch x heads) per SM, from the H200 measurements in benchmarks/results: Mamba-2 replay wins from ~8 x SMs (e.g.
# Nemotron-3-Nano-4B, 96 heads, loses at batch 8 and wins at 64); the GDN/KDA replay only from ~48 x SMs (fp32 state:
# 1.04-1.07x at batch 256-512 on Qwen3.5, 0.88-0.94x at batch 64).
REPLAY_MIN_WORK_PER_SM = {"mamba2": 8, "gdn": 48, "kda": 48}
# State dtypes whose replay is measured faster than the baseline, per family (GDN/KDA 16-bit states: not yet).
REPLAY_STATE_DTYPES = {"mamba2": (torch.float32, torch.float16, torch.bfloat16), "gdn": (torch.float32,),
                       "kda": (torch.float32,)}


def adaptive_threshold(family: str, device: torch.device) -> int:
    """Work items (batch x heads) below which ``mode='auto'`` flushes every step; env override
    ``TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD`` (work items, all families)."""
    env = os.environ.get("TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD")
    if env is not None:
        return int(env)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return REPLAY_MIN_WORK_PER_SM[family] * sm_count(index)


def force_flush_for(family: str, mode: str, batch: int, heads: int, state_dtype: torch.dtype,
                    device: torch.device) -> bool:
    """Whether a step runs in flush-every-step mode: always for ``flush``, never for ``replay``; ``auto`` flushes
    where replay is measured slower than the baseline (small batch x heads, or a state dtype not yet faster)."""
    if mode == "flush":
        return True
    if mode == "replay" or device.type != "cuda":
        return False
    if state_dtype not in REPLAY_STATE_DTYPES[family]:
        return True
    return batch * heads < adaptive_threshold(family, device)


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
