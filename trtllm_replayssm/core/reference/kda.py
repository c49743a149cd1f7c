"""Kimi Delta Attention decode references: float64 sequential recurrence (ground truth) and the float32 ReplaySSM step.

KDA is the gated delta rule with one decay per key channel. In the ``[.., HV, V, K]`` state layout, per token:
``u = beta (v - S Diag(alpha) k)``, ``S <- S Diag(alpha) + u k^T``, ``o = S (scale q)`` with q, k l2-normalised,
``beta = sigmoid(beta_raw)`` and the log-gate ``g = log(alpha)`` from the raw gate input (fla-core's in-kernel gate):

* plain: ``g = -exp(A_log) * softplus(g_raw + dt_bias)`` (softplus threshold 20);
* lower-bounded ("safe gate"): ``g = lower_bound * sigmoid(exp(A_log) * (g_raw + dt_bias))``, in ``(lower_bound, 0)``.

The replay ring ``g_ring [slots,HV,L,K]`` keeps the inclusive cumulative per-channel log-gate ``G_j`` since the
checkpoint and ``k_ring [slots,HV,L,K]`` one key per value head in the pre-decayed form ``e^{-G_j} k_j`` while
``G_j >= -PREDECAY_FLOOR`` on every channel, else raw (``gdn.PREDECAY_FLOOR``): a step then decays its ring keys by
``e^G`` alone and reads no per-entry gate, and any gate, however small, stays exact. The step math is the delta-rule
core of ``gdn.py`` with a ``[.., K]`` gate.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from trtllm_replayssm.core.checkpoint import Checkpoint
from trtllm_replayssm.core.reference.gdn import (
    FLOAT_DTYPES,
    LOG_GATE_FLOOR,
    check_qkv,
    check_rings,
    check_scalars,
    check_state_io,
    check_tensor,
    delta_rule_per_draft_verify_,
    delta_rule_replay_,
    delta_rule_verify_,
    delta_rule_sequential_step,
    delta_rule_update_,
    resolve_scale,
)


def check_lower_bound(lower_bound: object) -> None:
    """``lower_bound`` must be None or a finite negative float (a log-gate floor)."""
    if lower_bound is None:
        return
    if isinstance(lower_bound, bool) or not isinstance(lower_bound, (int, float)):
        raise TypeError(f"lower_bound: expected a float or None, got {type(lower_bound).__name__}")
    if not (math.isfinite(lower_bound) and lower_bound < 0):
        raise ValueError(f"lower_bound: expected a finite negative log-gate bound, got {lower_bound}")


def log_gate(
    g_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None = None  # noqa: N803
) -> torch.Tensor:
    """Per-channel log-gate ``[.., HV, K]`` from ``g_raw [.., HV, K]``, ``A_log [HV]``, ``dt_bias [HV, K] | [HV*K]``.

    Computed in the promoted dtype of the inputs; see the module docstring for the two gate forms.
    """
    num_heads, dim_k = g_raw.shape[-2:]
    x = g_raw + dt_bias.reshape(num_heads, dim_k)
    a = torch.exp(A_log).unsqueeze(-1)
    if lower_bound is None:
        return -a * F.softplus(x, threshold=20.0)
    return lower_bound * torch.sigmoid(a * x)


def sequential_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_raw: torch.Tensor, beta_raw: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None = None,  # noqa: N803
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 ground truth for one KDA token over a batch of rows: returns ``(out [b,HV,V], new state [b,HV,V,K])``.

    ``state [b,HV,V,K]``, ``q, k [b,H,K]``, ``v [b,HV,V]``, raw ``g_raw [b,HV,K]``, beta logit ``beta_raw [b,HV]``,
    ``A_log [HV]``, ``dt_bias [HV,K]`` (or ``[HV*K]``); any float dtypes.
    """
    f64 = torch.float64
    g = log_gate(g_raw.to(f64), A_log.to(f64), dt_bias.to(f64), lower_bound)
    return delta_rule_sequential_step(
        state, q, k, v, g, torch.sigmoid(beta_raw.to(f64)), resolve_scale(scale, q.shape[-1])
    )


def _step_gates(
    g_raw: torch.Tensor, beta_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
    lower_bound: float | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 ``(log_gate [b,HV,K] clamped to LOG_GATE_FLOOR, beta [b,HV])``."""
    f32 = torch.float32
    g = log_gate(g_raw.to(f32), A_log.to(f32), dt_bias.to(f32), lower_bound).clamp_min(LOG_GATE_FLOOR)
    return g, torch.sigmoid(beta_raw.to(f32))


def _check_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_raw: torch.Tensor, beta_raw: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None,  # noqa: N803
    state_batch_indices: torch.Tensor, out: torch.Tensor,
) -> tuple[int, int, int, int, int, int]:
    """Validate the step inputs shared by baseline and replay; return ``(batch, H, HV, K, V, slots)``."""
    check_lower_bound(lower_bound)
    batch, heads, v_heads, dim_k, dim_v = check_qkv(q, k, v)
    dev = q.device
    check_tensor("g_raw", g_raw, (batch, v_heads, dim_k), FLOAT_DTYPES, dev)
    check_tensor("beta_raw", beta_raw, (batch, v_heads), FLOAT_DTYPES, dev)
    check_tensor("A_log", A_log, (v_heads,), FLOAT_DTYPES, dev)
    if not isinstance(dt_bias, torch.Tensor):
        raise TypeError(f"dt_bias: expected a torch.Tensor, got {type(dt_bias).__name__}")
    bias_shape = (v_heads, dim_k) if dt_bias.dim() == 2 else (v_heads * dim_k,)
    check_tensor("dt_bias", dt_bias, bias_shape, FLOAT_DTYPES, dev)
    slots = check_state_io(state, state_batch_indices, out, batch, v_heads, dim_v, dim_k, dev)
    return batch, heads, v_heads, dim_k, dim_v, slots


def state_update_(
    state: torch.Tensor | Checkpoint, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_raw: torch.Tensor,
    beta_raw: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None, scale: float | None,  # noqa: N803
    state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor,
) -> None:
    """Float32 KDA baseline step in place: read S, update, write S (state dtype) and ``out``; pad rows get zero
    outputs."""
    check_scalars(pad_slot_id)
    _check_step(state, q, k, v, g_raw, beta_raw, A_log, dt_bias, lower_bound, state_batch_indices, out)
    g, beta = _step_gates(g_raw, beta_raw, A_log, dt_bias, lower_bound)
    scale = resolve_scale(scale, q.shape[-1])
    delta_rule_update_(state, q, k, v, g, beta, scale, state_batch_indices, pad_slot_id, out)


def replay_step_(
    state: torch.Tensor | Checkpoint, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
    cursor: torch.Tensor,
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_raw: torch.Tensor, beta_raw: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None, scale: float | None,  # noqa: N803
    state_batch_indices: torch.Tensor, pad_slot_id: int, force_flush: bool, out: torch.Tensor,
) -> None:
    """Float32 KDA ReplaySSM step in place on the cache (state, rings, cursor) and ``out``; the ops' CPU fallback.

    Cache: ``state [slots,HV,V,K]`` fp32/fp16/bf16, ``u_ring [slots,HV,L,V]`` in the activation dtype, ``k_ring
    [slots,HV,L,K]`` (pre-decayed keys, ``core.layouts.key_ring_dtype``), ``g_ring [slots,HV,L,K]`` fp32 (inclusive cumulative
    per-channel log-gate since the checkpoint),
    ``cursor [slots]`` int32. Step: ``q, k [b,H,K]``, ``v [b,HV,V]``, ``g_raw [b,HV,K]``, ``beta_raw [b,HV]``,
    ``A_log [HV]``, ``dt_bias [HV,K]``, ``lower_bound`` (None: plain gate), ``scale`` (None: K^-0.5),
    ``state_batch_indices [b]`` int32. A row flushes when its cursor is L-1 or ``force_flush``.
    """
    check_scalars(pad_slot_id, force_flush)
    _, heads, v_heads, dim_k, dim_v, slots = _check_step(
        state, q, k, v, g_raw, beta_raw, A_log, dt_bias, lower_bound, state_batch_indices, out
    )
    check_rings(u_ring, k_ring, g_ring, cursor, q, (slots, heads, v_heads, dim_k, dim_v), per_channel_gate=True)
    g, beta = _step_gates(g_raw, beta_raw, A_log, dt_bias, lower_bound)
    delta_rule_replay_(
        state, u_ring, k_ring, g_ring, cursor, q, k, v, g, beta, resolve_scale(scale, dim_k),
        state_batch_indices, pad_slot_id, force_flush, out, predecayed_keys=True,
    )


def verify_step_(
    state: torch.Tensor | Checkpoint, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
    cursor: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g_raw: torch.Tensor,
    beta_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None,  # noqa: N803
    scale: float | None, state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor,
) -> None:
    """KDA speculative verify (``gdn.delta_rule_verify_``): q, k [b,T,H,K], v [b,T,HV,V], g_raw [b,T,HV,K],
    beta_raw [b,T,HV]; out [b,T,HV,V]."""
    g, beta = _step_gates(g_raw, beta_raw, A_log, dt_bias, lower_bound)
    delta_rule_verify_(state, u_ring, k_ring, g_ring, cursor, q, k, v, g, beta, resolve_scale(scale, q.shape[-1]),
                       state_batch_indices, pad_slot_id, out, predecayed_keys=True)


def per_draft_verify_(
    state: torch.Tensor, inter: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    g_raw: torch.Tensor, beta_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
    lower_bound: float | None, scale: float | None, state_batch_indices: torch.Tensor, pad_slot_id: int,
    out: torch.Tensor,
) -> None:
    """KDA per-draft-state verify (``gdn.delta_rule_per_draft_verify_``), inputs as :func:`verify_step_`."""
    g, beta = _step_gates(g_raw, beta_raw, A_log, dt_bias, lower_bound)
    delta_rule_per_draft_verify_(state, inter, q, k, v, g, beta, resolve_scale(scale, q.shape[-1]),
                                 state_batch_indices, pad_slot_id, out)
