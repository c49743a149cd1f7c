"""Argument validation shared by the ops: every error names the argument, the expectation and what was given."""
from __future__ import annotations

from typing import Sequence

import torch

from trtllm_replayssm.core.formats import DTYPES

FLOAT_DTYPES = tuple(d.torch for d in DTYPES)  # states and activations


def check_tensor(name: str, t: object, shape: Sequence[int | None], dtypes: Sequence[torch.dtype],
                 device: torch.device | None = None, inner_contiguous: int = 1) -> torch.Tensor:
    """Check type, rank/shape (None = any), dtype, device, and that the last ``inner_contiguous`` dims are dense."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or any(e is not None and e != a for e, a in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got {t.device}")
    expected_stride = 1
    for dim in range(t.dim() - 1, t.dim() - 1 - inner_contiguous, -1):
        if t.shape[dim] > 1 and t.stride(dim) != expected_stride:
            raise ValueError(f"{name}: the last {inner_contiguous} dim(s) must be contiguous "
                             f"(strides {list(t.stride())} for shape {list(t.shape)})")
        expected_stride *= t.shape[dim]
    return t


def check_optional(name: str, t: object, shape: Sequence[int | None], dtypes: Sequence[torch.dtype],
                   device: torch.device | None = None, inner_contiguous: int = 1) -> torch.Tensor | None:
    return None if t is None else check_tensor(name, t, shape, dtypes, device, inner_contiguous)


def check_aligned(name: str, t: torch.Tensor, elems: int) -> None:
    """Vector loads read ``elems`` consecutive elements: the base and the strides of outer dims must keep alignment."""
    bytes_ = elems * t.element_size()
    align = min(bytes_, 16)
    if t.data_ptr() % align or any(s * t.element_size() % align for s in t.stride()[:-1] if s):
        raise ValueError(f"{name}: rows must be {align}-byte aligned for vector loads "
                         f"(data_ptr % {align} = {t.data_ptr() % align}, strides {list(t.stride())})")


def check_scratch_rows(batch: int, slots: int) -> None:
    """The replay's per-step scratch has one row per slot and is indexed by batch row: batch <= slots."""
    if batch > slots:
        raise ValueError(f"x: batch {batch} exceeds the cache's {slots} slots (the replay scratch has one row per slot)")


def slot_indices(name: str, idx: torch.Tensor | None, batch: int, slots: int, pad_slot_id: int,
                 device: torch.device) -> torch.Tensor:
    """Validate ``state_batch_indices`` ([batch] int32); default: rows 0..batch-1 map to slots 0..batch-1.

    Values are range-checked on the host only for CPU tensors (a device check would need a sync).
    """
    if idx is None:
        if batch > slots:
            raise ValueError(f"{name}: batch {batch} exceeds the {slots} cache slots; pass explicit slot indices")
        return torch.arange(batch, dtype=torch.int32, device=device)
    check_tensor(name, idx, (batch,), (torch.int32,), device)
    if idx.device.type == "cpu" and batch:
        bad = ((idx < 0) | (idx >= slots)) & (idx != pad_slot_id)
        if bool(bad.any()):
            raise ValueError(f"{name}: values must be in [0, {slots}) or pad_slot_id={pad_slot_id}, "
                             f"got {idx[bad].tolist()}")
    return idx
