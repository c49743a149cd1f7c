"""Checks shared by the kernel-contract tests of every family: relative error, poisoned-output rows."""
from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))


def assert_rows_written(out: torch.Tensor, slot_ids: list[int]) -> None:
    """``out`` was NaN-poisoned before the step: pad rows (slot < 0) stay NaN, every other row is fully written."""
    for r, s in enumerate(slot_ids):
        if s < 0:
            assert torch.isnan(out[r]).all(), "pad row output was written"
        else:
            assert not torch.isnan(out[r]).any(), "output row not fully written"
