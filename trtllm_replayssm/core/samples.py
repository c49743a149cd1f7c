"""Random, valid inputs of each family: one decode step's inputs, state pools, ring contents and slot ids. The
benchmark, the op tests and ``torch.library.opcheck`` draw from here. Never zeros: every value is random."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields, replace
from typing import ClassVar

import torch

from trtllm_replayssm.core.cache import GDNLayerCache, Mamba2LayerCache
from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims, SSMDims
from trtllm_replayssm.core.formats import torch_dtype


def slot_indices(batch: int, generator: torch.Generator, device: torch.device | str) -> torch.Tensor:
    """int32 slot ids of ``batch`` rows in a pool of ``batch + 1`` slots: a random permutation of 1..batch (0 unused)."""
    if batch < 1:
        raise ValueError(f"batch: expected >= 1, got {batch}")
    return (torch.randperm(batch, generator=generator) + 1).to(torch.int32).to(device)


def _log_uniform(n: tuple[int, ...], lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return torch.exp(torch.empty(n).uniform_(math.log(lo), math.log(hi), generator=gen))


def _device_generator(gen: torch.Generator, device: torch.device | str) -> torch.Generator:
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    return torch.Generator(device=device).manual_seed(seed)


@dataclass
class Mamba2Step:
    """Mamba-2 step inputs: x [b,H,P], dt [b,H] fp32 (raw, before bias + softplus), A/D/dt_bias [H] fp32,
    B/C [b,G,N]."""

    x: torch.Tensor
    dt: torch.Tensor
    A: torch.Tensor
    B: torch.Tensor
    C: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor

    per_head_fields: ClassVar[tuple[str, ...]] = ("A", "D", "dt_bias")  # the layer's constants, not per token

    def op_args(self) -> tuple[tuple, dict]:
        """Positional and keyword arguments of ``replay_decode`` / ``state_update`` after the cache or state."""
        return (self.x, self.dt, self.A, self.B, self.C), {"D": self.D, "z": None, "dt_bias": self.dt_bias,
                                                            "dt_softplus": True}


@dataclass
class DeltaStep:
    """GDN / KDA step inputs (raw, as the ops take them): q, k [b,H,K], v [b,HV,V], gate input a ([b,HV] GDN,
    [b,HV,K] KDA) and beta logits b [b,HV] in the activation dtype; A_log [HV] and dt_bias ([HV] GDN, [HV,K] KDA)
    fp32. Per token: g = -exp(A_log) * softplus(a + dt_bias), beta = sigmoid(b); q, k are l2-normalised in-kernel."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    a: torch.Tensor
    b: torch.Tensor
    A_log: torch.Tensor
    dt_bias: torch.Tensor

    per_head_fields: ClassVar[tuple[str, ...]] = ("A_log", "dt_bias")

    def op_args(self) -> tuple[tuple, dict]:
        return tuple(getattr(self, f.name) for f in fields(self)), {}


def step_rows(step: Mamba2Step | DeltaStep, rows: torch.Tensor | list[int] | tuple) -> Mamba2Step | DeltaStep:
    """The step inputs of batch rows ``rows`` (any index of the per-token fields; the layer constants unchanged)."""
    return replace(step, **{f.name: getattr(step, f.name)[rows] for f in fields(step)
                            if f.name not in step.per_head_fields})


def window_token(step: Mamba2Step | DeltaStep, t: int) -> Mamba2Step | DeltaStep:
    """Token ``t`` of a speculative window's inputs: per-token fields ``[b, T, ...]`` -> ``[b, ...]``."""
    return step_rows(step, (slice(None), t))


def with_constants(step: Mamba2Step | DeltaStep, constants: Mamba2Step | DeltaStep) -> Mamba2Step | DeltaStep:
    """``step``'s per-token inputs with ``constants``' layer constants (a layer keeps its A, D, dt_bias, A_log)."""
    return replace(step, **{name: getattr(constants, name) for name in step.per_head_fields})


def mamba2_step(dims: Mamba2Dims, batch: int, gen: torch.Generator, device: torch.device | str,
                act_dtype: torch.dtype = torch.bfloat16) -> Mamba2Step:
    """Inputs with Δ = softplus(dt + dt_bias) roughly log-uniform in [1e-3, 1e-1] and A uniform in [-16, -1]."""
    H, P, N, G = dims.nheads, dims.head_dim, dims.d_state, dims.n_groups
    delta = _log_uniform((H,), 1e-3, 1e-1, gen)
    return Mamba2Step(
        x=torch.randn(batch, H, P, generator=gen).to(act_dtype).to(device),
        dt=(0.1 * torch.randn(batch, H, generator=gen)).to(device),
        A=(-torch.empty(H).uniform_(1.0, 16.0, generator=gen)).to(device),
        B=(torch.randn(batch, G, N, generator=gen) / math.sqrt(N)).to(act_dtype).to(device),
        C=(torch.randn(batch, G, N, generator=gen) / math.sqrt(N)).to(act_dtype).to(device),
        D=torch.ones(H).to(device),
        dt_bias=torch.log(torch.expm1(delta)).to(device),  # inverse softplus
    )


def delta_step(dims: GDNDims | KDADims, batch: int, gen: torch.Generator, device: torch.device | str,
               act_dtype: torch.dtype = torch.bfloat16) -> DeltaStep:
    """GDN (per-head gate) or KDA (per-channel gate) inputs with per-token decays e^g roughly in [0.9, 0.999]."""
    H, HV, K, V = dims.key_heads, dims.heads, dims.cols, dims.rows
    gate_shape = (HV, K) if dims.per_channel_gate else (HV,)
    decay_rate = _log_uniform(gate_shape, 1e-3, 1e-1, gen)  # -g at a = 0: exp(A_log) * softplus(dt_bias)
    return DeltaStep(
        q=torch.randn(batch, H, K, generator=gen).to(act_dtype).to(device),
        k=torch.randn(batch, H, K, generator=gen).to(act_dtype).to(device),
        v=torch.randn(batch, HV, V, generator=gen).to(act_dtype).to(device),
        a=(0.1 * torch.randn(batch, *gate_shape, generator=gen)).to(act_dtype).to(device),
        b=torch.randn(batch, HV, generator=gen).to(act_dtype).to(device),
        A_log=torch.zeros(HV).to(device),
        dt_bias=torch.log(torch.expm1(decay_rate)).to(device),  # inverse softplus
    )


def random_state(slots: int, dims: SSMDims, state_dtype: str | torch.dtype, gen: torch.Generator,
                 device: torch.device | str) -> torch.Tensor:
    """A state pool [slots, heads, rows, cols] with small random values."""
    s = torch.empty(slots, dims.heads, dims.rows, dims.cols, dtype=torch_dtype(state_dtype, "state_dtype"),
                    device=device)
    return s.normal_(0.0, 0.1, generator=_device_generator(gen, device))


def fill_rings_(layer: Mamba2LayerCache | GDNLayerCache, gen: torch.Generator) -> None:
    """Valid random ring records in every slot: activations N(0, 0.1); Mamba-2 Δ (after bias + softplus) in
    [1e-3, 1e-1]; GDN/KDA inclusive cumulative log-gates, negative and falling along the ring."""
    dev_gen = _device_generator(gen, layer.state.device)
    if isinstance(layer, Mamba2LayerCache):
        layer.x_ring.normal_(0.0, 0.1, generator=dev_gen)
        layer.B_ring.normal_(0.0, 0.1, generator=dev_gen)
        layer.dt_ring.uniform_(1e-3, 1e-1, generator=dev_gen)
        return
    layer.u_ring.normal_(0.0, 0.1, generator=dev_gen)
    layer.k_ring.normal_(0.0, 0.1, generator=dev_gen)
    steps = torch.empty_like(layer.g_ring).uniform_(-0.1, -1e-3, generator=dev_gen)
    layer.g_ring.copy_(steps.cumsum(dim=2))
