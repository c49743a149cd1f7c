"""Random Mamba-2 problems and a float64 sequential driver shared by the CPU and GPU tests."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_replayssm.core.reference import mamba2 as ref


@dataclass
class Mamba2Params:
    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor


def make_params(nheads: int, device, gen: torch.Generator) -> Mamba2Params:
    """Per-head A in [-16, -1), D, dt_bias (fp32), as the benchmark draws them."""
    A = -(1.0 + 15.0 * torch.rand(nheads, generator=gen)).to(device)
    D = torch.randn(nheads, generator=gen).to(device)
    dt_bias = (torch.rand(nheads, generator=gen) * 4.0 - 6.0).to(device)  # softplus(~-4) ~ 0.02
    return Mamba2Params(A, D, dt_bias)


def make_step(batch: int, nheads: int, head_dim: int, d_state: int, ngroups: int, act_dtype: torch.dtype, device,
              gen: torch.Generator, with_z: bool = True) -> dict[str, torch.Tensor | None]:
    """Fresh random step inputs (never zeros)."""
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=device, dtype=act_dtype)
    return {
        "x": rnd(batch, nheads, head_dim),
        "dt": rnd(batch, nheads, scale=1.5),
        "B": rnd(batch, ngroups, d_state, scale=0.3),
        "C": rnd(batch, ngroups, d_state, scale=0.3),
        "z": rnd(batch, nheads, head_dim) if with_z else None,
    }


class Float64Sequential:
    """Ground truth: one float64 state per slot, advanced token by token."""

    def __init__(self, init_states: torch.Tensor) -> None:
        self.states = init_states.to(torch.float64).clone()

    def step(self, slots: list[int], inputs: dict, params: Mamba2Params) -> torch.Tensor:
        rows = [i for i, s in enumerate(slots) if s >= 0]
        take = torch.tensor(rows, dtype=torch.long, device=self.states.device)
        slot_t = torch.tensor([slots[i] for i in rows], dtype=torch.long, device=self.states.device)
        z = inputs["z"]
        new, y = ref.sequential_step(self.states[slot_t], inputs["x"][take], inputs["dt"][take], params.A,
                                     inputs["B"][take], inputs["C"][take], params.D,
                                     None if z is None else z[take], params.dt_bias, True)
        self.states[slot_t] = new
        full = torch.zeros(inputs["x"].shape, dtype=torch.float64, device=self.states.device)
        full[take] = y
        return full
