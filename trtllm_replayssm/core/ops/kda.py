"""Kimi Delta Attention decode ops: ``torch.ops.replayssm.kda_replay_decode`` and ``torch.ops.replayssm.kda_state_update``.

Same structure as ``ops/gdn.py`` (whose launch helpers this module uses): CUDA tensors run
``plugins/delta_rule_decode.cu`` with KDA=1 (one log-gate per key channel), CPU tensors run the float32 reference
(``reference/kda.py``). The log-gate comes from the raw gate input in the kernel, as the reference computes it:
plain ``-exp(A_log) softplus(g + dt_bias)`` or, with ``lower_bound``, ``lower_bound * sigmoid(exp(A_log)(g + dt_bias))``,
clamped to -128. The gate ring holds cumulative log-gates (not pre-decayed keys), so every decay factor has a
non-positive exponent and no gate value, however small, can overflow.
"""
from __future__ import annotations

from typing import Optional

import torch

from trtllm_replayssm.core.cache import KDALayerCache
from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core.ops.launch import force_flush_for
from trtllm_replayssm.core.ops.gdn import (fill_params, launch_delta, replay_kernels, resolve_scale, validate_common,
                                      validate_rings)
from trtllm_replayssm.core.reference import kda as ref


# ---------------------------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("replayssm::kda_replay_decode",
                         mutates_args=("state", "u_ring", "k_ring", "g_ring", "cursor", "arrive", "coef", "step",
                                       "out"))
def _replay_decode_op(state: torch.Tensor, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
                      cursor: torch.Tensor, arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor,
                      q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      g: torch.Tensor, beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,
                      lower_bound: Optional[float], scale: float, state_batch_indices: torch.Tensor,
                      pad_slot_id: int, force_flush: bool, out: torch.Tensor) -> None:
    ref.replay_step_(state, u_ring, k_ring, g_ring, cursor, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale,
                     state_batch_indices, pad_slot_id, force_flush, out)


@_replay_decode_op.register_kernel("cuda")
def _replay_decode_cuda(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, g, beta, A_log, dt_bias,
                        lower_bound, scale, state_batch_indices, pad_slot_id, force_flush, out) -> None:
    if q.shape[0] == 0:
        return
    params = fill_params(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, g, beta, A_log, dt_bias,
                         scale, lower_bound, state_batch_indices, pad_slot_id, force_flush, out)
    launch_delta("kda", replay_kernels(force_flush, q.device), params, state, q, v)


@_replay_decode_op.register_fake
def _replay_decode_fake(*args, **kwargs) -> None:
    return None


@torch.library.custom_op("replayssm::kda_state_update", mutates_args=("state", "out"))
def _state_update_op(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                     beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: Optional[float],
                     scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor) -> None:
    ref.state_update_(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, state_batch_indices, pad_slot_id,
                      out)


@_state_update_op.register_kernel("cuda")
def _state_update_cuda(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, state_batch_indices, pad_slot_id,
                       out) -> None:
    if q.shape[0] == 0:
        return
    params = fill_params(state, None, None, None, None, None, None, None, q, k, v, g, beta, A_log, dt_bias, scale,
                         lower_bound, state_batch_indices, pad_slot_id, False, out)
    launch_delta("kda", ("delta_state_update_kernel",), params, state, q, v)


@_state_update_op.register_fake
def _state_update_fake(*args, **kwargs) -> None:
    return None


# ---------------------------------------------------------------------------------------------------- public API
def _validate_step(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, out, state_batch_indices, pad_slot_id):
    ref.check_lower_bound(lower_bound)
    idx, out, dims = validate_common(state, q, k, v, out, state_batch_indices, pad_slot_id)
    _, _, HV, _, K = dims
    dev, batch = state.device, q.shape[0]
    chk.check_tensor("g", g, (batch, HV, K), (q.dtype, torch.float32), dev)
    chk.check_tensor("beta", beta, (batch, HV), (q.dtype, torch.float32), dev, inner_contiguous=0)
    chk.check_tensor("A_log", A_log, (HV,), (torch.float32,), dev)
    bias_shape = (HV * K,) if isinstance(dt_bias, torch.Tensor) and dt_bias.dim() == 1 else (HV, K)
    chk.check_tensor("dt_bias", dt_bias, bias_shape, (torch.float32,), dev, inner_contiguous=len(bias_shape))
    if dev.type == "cuda":
        chk.check_aligned("g", g, K // 32)
        chk.check_aligned("dt_bias", dt_bias, K // 32)
    return idx, out, dims


def replay_decode(layer: KDALayerCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                  lower_bound: float | None = None, scale: float | None = None,
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, mode: str = "auto") -> torch.Tensor:
    """One ReplaySSM KDA decode step for a batch of rows at their own cursors; returns ``out`` [b, HV, V].

    ``layer``: a :class:`~trtllm_replayssm.core.cache.KDALayerCache`. ``q, k`` [b,H,K], ``v`` [b,HV,V] (activation
    dtype), raw gate ``g`` [b,HV,K] and beta logits ``beta`` [b,HV] (activation dtype or fp32), ``A_log`` [HV] fp32,
    ``dt_bias`` [HV,K] (or [HV*K]) fp32, ``lower_bound`` (None: plain gate; else a negative log-gate bound).
    ``mode``: ``auto``, ``replay`` or ``flush`` (as ``ops.gdn.replay_decode``).
    """
    if not isinstance(layer, KDALayerCache):
        raise TypeError(f"layer: expected a KDALayerCache, got {type(layer).__name__}")
    chk.check_mode(mode)
    idx, out, dims = _validate_step(layer.state, q, k, v, g, beta, A_log, dt_bias, lower_bound, out,
                                    state_batch_indices, pad_slot_id)
    validate_rings(layer, dims, q.dtype, per_channel_gate=True, batch=q.shape[0])
    force = force_flush_for("kda", mode, q.shape[0], dims[2], layer.state.dtype, layer.state.device)
    torch.ops.replayssm.kda_replay_decode(layer.state, layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor,
                                          layer.arrive, layer.coef, layer.step, q, k, v, g, beta, A_log, dt_bias,
                                          None if lower_bound is None else float(lower_bound),
                                          resolve_scale(scale, dims[4]), idx, pad_slot_id, force, out)
    return out


def state_update(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                 lower_bound: float | None = None, scale: float | None = None,
                 state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Baseline KDA step (read state, update, write state) on a slot pool ``state`` [slots,HV,V,K]; returns ``out``."""
    idx, out, dims = _validate_step(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, out, state_batch_indices,
                                    pad_slot_id)
    torch.ops.replayssm.kda_state_update(state, q, k, v, g, beta, A_log, dt_bias,
                                         None if lower_bound is None else float(lower_bound),
                                         resolve_scale(scale, dims[4]), idx, pad_slot_id, out)
    return out
