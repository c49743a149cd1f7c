"""Random decode-step inputs and slot indices shared by every implementation of one benchmark case."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from .shapes import BenchShape

STATE_TORCH_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
ACT_DTYPE = torch.bfloat16


def torch_state_dtype(state_dtype: str) -> torch.dtype:
    """torch dtype of a state dtype name."""
    if state_dtype not in STATE_TORCH_DTYPES:
        raise ValueError(f"state_dtype: expected one of {sorted(STATE_TORCH_DTYPES)}, got {state_dtype!r}")
    return STATE_TORCH_DTYPES[state_dtype]


def slot_indices(batch: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """int32 slot ids of `batch` rows in a pool of ``batch + 1`` slots: a random permutation of 1..batch (0 = pad)."""
    if batch < 1:
        raise ValueError(f"batch: expected >= 1, got {batch}")
    return (torch.randperm(batch, generator=generator) + 1).to(torch.int32).to(device)


def _log_uniform(n: tuple[int, ...], lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return torch.exp(torch.empty(n).uniform_(math.log(lo), math.log(hi), generator=gen))


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


def mamba2_step(shape: BenchShape, batch: int, gen: torch.Generator, device: torch.device) -> Mamba2Step:
    """Inputs with Δ = softplus(dt + dt_bias) roughly log-uniform in [1e-3, 1e-1] and A uniform in [-16, -1]."""
    H, P, N, G = shape.heads, shape.head_dim, shape.key_dim, shape.key_heads
    delta = _log_uniform((H,), 1e-3, 1e-1, gen)
    dt_bias = torch.log(torch.expm1(delta))  # inverse softplus
    return Mamba2Step(
        x=torch.randn(batch, H, P, generator=gen).to(ACT_DTYPE).to(device),
        dt=(0.1 * torch.randn(batch, H, generator=gen)).to(device),
        A=(-torch.empty(H).uniform_(1.0, 16.0, generator=gen)).to(device),
        B=(torch.randn(batch, G, N, generator=gen) / math.sqrt(N)).to(ACT_DTYPE).to(device),
        C=(torch.randn(batch, G, N, generator=gen) / math.sqrt(N)).to(ACT_DTYPE).to(device),
        D=torch.ones(H).to(device),
        dt_bias=dt_bias.to(device),
    )


def delta_step(shape: BenchShape, batch: int, gen: torch.Generator, device: torch.device) -> DeltaStep:
    """GDN (per-head gate) or KDA (per-channel gate) inputs with per-token decays e^g roughly in [0.9, 0.999]."""
    H, HV, K, V = shape.key_heads, shape.heads, shape.key_dim, shape.head_dim
    gate_shape = (HV, K) if shape.family == "kda" else (HV,)
    decay_rate = _log_uniform(gate_shape, 1e-3, 1e-1, gen)  # -g at a = 0: exp(A_log) * softplus(dt_bias)
    A_log = torch.zeros(HV)
    return DeltaStep(
        q=torch.randn(batch, H, K, generator=gen).to(ACT_DTYPE).to(device),
        k=torch.randn(batch, H, K, generator=gen).to(ACT_DTYPE).to(device),
        v=torch.randn(batch, HV, V, generator=gen).to(ACT_DTYPE).to(device),
        a=(0.1 * torch.randn(batch, *gate_shape, generator=gen)).to(ACT_DTYPE).to(device),
        b=torch.randn(batch, HV, generator=gen).to(ACT_DTYPE).to(device),
        A_log=A_log.to(device),
        dt_bias=torch.log(torch.expm1(decay_rate)).to(device),  # inverse softplus
    )


def random_state(slots: int, shape: BenchShape, state_dtype: str, gen: torch.Generator,
                 device: torch.device) -> torch.Tensor:
    """A state pool [slots, heads, head_dim, key_dim] with small random values."""
    s = torch.empty(slots, shape.heads, shape.head_dim, shape.key_dim, dtype=torch_state_dtype(state_dtype),
                    device=device)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    return s.normal_(0.0, 0.1, generator=dev_gen)
