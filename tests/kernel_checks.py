"""Checks shared by the kernel-contract tests of every family: relative error, poisoned-output rows, steps launched
back to back; the activation-dtype tolerances and inputs of the layer-op tests."""
from __future__ import annotations

from typing import Callable

import torch

DEV = "cuda" if torch.cuda.is_available() else "cpu"
ACT_DTYPES = [torch.bfloat16, torch.float32]


def act_tol(dtype: torch.dtype) -> dict[str, float]:
    """Layer-op outputs against float64: bf16 outputs are rounded to bf16 (and the references round intermediates
    too): 2 ulps; fp32 1e-5."""
    return dict(rtol=2 ** -6, atol=2 ** -6) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)


def randn_on(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    """Standard normal values drawn on the CPU from ``gen``, in ``dtype`` on DEV."""
    return torch.randn(shape, generator=gen).to(dtype).to(DEV)


def silu64(v: torch.Tensor) -> torch.Tensor:
    v = v.double()
    return v * torch.sigmoid(v)


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``||a - b|| / ||b||`` in float64."""
    a64, b64 = a.to(torch.float64), b.to(torch.float64)
    return float((a64 - b64).norm() / b64.norm().clamp_min(1e-30))


def assert_rows_written(out: torch.Tensor, slot_ids: list[int]) -> None:
    """``out`` was NaN-poisoned before the step: pad rows (slot < 0) are zeros, every other row is fully written."""
    for r, s in enumerate(slot_ids):
        if s < 0:
            assert (out[r] == 0).all(), "pad row output is not zeros"
        else:
            assert not torch.isnan(out[r]).any(), "output row not fully written"


def check_back_to_back(launch: Callable[[dict, torch.Tensor], None], expect: Callable[[dict], torch.Tensor],
                       truth_states: Callable[[], torch.Tensor], xs: list[dict], outs: list[torch.Tensor],
                       slot_ids: list[int], checkpoint: torch.Tensor, cursor: torch.Tensor) -> None:
    """Launches `launch(x, out)` for every step with nothing in between (each step's prep kernel directly after the
    previous step's main kernel), then checks each NaN-poisoned output against `expect(x)` (the float64 step, called
    in order; `truth_states()` its per-slot states after it) and each real slot's checkpoint against the float64
    state `cursor[slot]` steps before the end."""
    torch.cuda.synchronize()
    for x, out in zip(xs, outs):
        launch(x, out)
    torch.cuda.synchronize()
    rows = [r for r, s in enumerate(slot_ids) if s >= 0]
    real = [slot_ids[r] for r in rows]
    history, worst = [], 0.0  # history[t][s]: slot s's float64 state after step t
    for x, out in zip(xs, outs):
        expected = expect(x)
        assert_rows_written(out, slot_ids)
        worst = max(worst, rel_err(out[rows], expected[rows]))
        history.append({s: truth_states()[s].clone() for s in real})
    for s in real:
        assert rel_err(checkpoint[s], history[len(xs) - 1 - int(cursor[s])][s]) <= 1e-5, f"slot {s}"
    assert worst <= 1e-5
