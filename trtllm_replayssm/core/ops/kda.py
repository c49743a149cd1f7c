"""Kimi Delta Attention decode ops: ``torch.ops.replayssm.kda_replay_decode`` and ``torch.ops.replayssm.kda_state_update``.

Same structure as ``gdn.py`` (both build on ``delta.py``): CUDA tensors run ``plugins/delta_rule_decode.cu`` with KDA=1
(one log-gate per key channel), CPU tensors run the float32 reference (``core/reference/kda.py``). The log-gate comes
from the raw gate input in the kernel, as the reference computes it: plain ``-exp(A_log) softplus(g + dt_bias)`` or,
with ``lower_bound``, ``lower_bound * sigmoid(exp(A_log)(g + dt_bias))``, clamped to -128. The gate ring holds
cumulative log-gates and the key ring one key per value head, pre-decayed (``e^{-G_j} k_j``) while the cumulative gate
allows (core/reference/gdn.py PREDECAY_FLOOR), so every decay factor has a non-positive exponent.
"""
from __future__ import annotations

from typing import Optional

import torch

from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core.cache import KDALayerCache
from trtllm_replayssm.core.checkpoint import OP_TENSORS, Checkpoint, spec_of_op_args, spec_op_args
from trtllm_replayssm.core.dims import KDADims
from trtllm_replayssm.core.jit.configs import KernelConfig
from trtllm_replayssm.core.ops import delta
from trtllm_replayssm.core.ops.launch import define_op
from trtllm_replayssm.core.ops.spec import check_window
from trtllm_replayssm.core.plans import Device, Launch, LaunchPlan, Tuning, checked_plan
from trtllm_replayssm.core.reference import kda as ref


def replay_plan(layer: KDALayerCache, batch: int, mode: str = "auto", tuning: Tuning = delta.DEFAULT_TUNING,
                device: Device | None = None) -> LaunchPlan:
    """The launch plan of :func:`replay_decode` for ``batch`` rows of ``layer`` (``device``: the layer's GPU)."""
    return delta.replay_plan(layer, batch, True, mode, tuning, device)


def state_update_plan(state: torch.Tensor, batch: int, act_dtype: torch.dtype, tuning: Tuning = delta.DEFAULT_TUNING,
                      device: Device | None = None) -> LaunchPlan:
    """The launch plan of :func:`state_update` for ``batch`` rows of the pool ``state`` [slots, HV, V, K]."""
    return delta.state_update_plan(state, batch, act_dtype, True, tuning, device)


def kernel_configs(dims: KDADims, state_dtype: torch.dtype, act_dtype: torch.dtype) -> list[KernelConfig]:
    """Every module a layer of ``dims`` can launch at any batch size (all row tiles)."""
    return delta.kernel_configs(True, dims.head_dim, dims.head_dim, state_dtype, act_dtype)


# ---------------------------------------------------------------------------------------------------- custom ops
def _replay_cpu(state: torch.Tensor, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
                cursor: torch.Tensor, arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
                dt_bias: torch.Tensor, lower_bound: Optional[float], scale: float, state_batch_indices: torch.Tensor,
                pad_slot_id: int, plan: list[int], out: torch.Tensor) -> None:
    ref.replay_step_(state, u_ring, k_ring, g_ring, cursor, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale,
                     state_batch_indices, pad_slot_id, Launch.from_words(plan).mode == "flush", out)


def _replay_cuda(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, g, beta, A_log,  # noqa: N803
                 dt_bias, lower_bound, scale, state_batch_indices, pad_slot_id, plan, out) -> None:
    delta.run(True, plan, state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, g, beta, A_log, dt_bias,
              scale, lower_bound, state_batch_indices, pad_slot_id, out)


_replay_op = define_op("kda_replay_decode",
                       ("state", "u_ring", "k_ring", "g_ring", "cursor", "arrive", "coef", "step", "out"),
                       _replay_cpu, _replay_cuda)


def _state_update_cpu(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                      beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                      lower_bound: Optional[float], scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int,
                      plan: list[int], out: torch.Tensor) -> None:
    ref.state_update_(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, state_batch_indices, pad_slot_id,
                      out)


def _state_update_cuda(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, state_batch_indices,  # noqa: N803
                       pad_slot_id, plan, out) -> None:
    delta.run(True, plan, state, None, None, None, None, None, None, None, q, k, v, g, beta, A_log, dt_bias, scale,
              lower_bound, state_batch_indices, pad_slot_id, out)


_state_update_op = define_op("kda_state_update", ("state", "out"), _state_update_cpu, _state_update_cuda)


# Stored checkpoints (quantized, dual or stochastically rounded): the same steps over a Checkpoint's tensors
# (Checkpoint.op_tensors, checkpoint.spec_op_args and the seed ahead of the plain ops' arguments).
def _replay_stored_cpu(state: torch.Tensor, state_scale: Optional[torch.Tensor], state_bscale: Optional[torch.Tensor],
                       read: Optional[torch.Tensor], read_scale: Optional[torch.Tensor],
                       read_bscale: Optional[torch.Tensor], flushes: Optional[torch.Tensor], state_format: str,
                       state_mode: str, master_format: str, stochastic_rounding: bool, seed: int,
                       u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor, cursor: torch.Tensor,
                       arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
                       dt_bias: torch.Tensor, lower_bound: Optional[float], scale: float,
                       state_batch_indices: torch.Tensor, pad_slot_id: int, plan: list[int],
                       out: torch.Tensor) -> None:
    ckpt = Checkpoint.from_op_args((state, state_scale, state_bscale, read, read_scale, read_bscale, flushes),
                                   spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    _replay_cpu(ckpt, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, g, beta, A_log, dt_bias,
                lower_bound, scale, state_batch_indices, pad_slot_id, plan, out)


def _replay_stored_cuda(state, state_scale, state_bscale, read, read_scale, read_bscale, flushes, state_format,
                        state_mode, master_format, stochastic_rounding, seed, u_ring, k_ring, g_ring, cursor, arrive,
                        coef, step, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale,  # noqa: N803
                        state_batch_indices, pad_slot_id, plan, out) -> None:
    stored = ((state_scale, state_bscale, read, read_scale, read_bscale, flushes),
              spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    delta.run(True, plan, state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, g, beta, A_log, dt_bias,
              scale, lower_bound, state_batch_indices, pad_slot_id, out, stored)


_replay_stored_op = define_op("kda_replay_decode_stored",
                              (*OP_TENSORS, "u_ring", "k_ring", "g_ring", "cursor", "arrive", "coef", "step", "out"),
                              _replay_stored_cpu, _replay_stored_cuda)


def _state_update_stored_cpu(state: torch.Tensor, state_scale: Optional[torch.Tensor],
                             state_bscale: Optional[torch.Tensor], read: Optional[torch.Tensor],
                             read_scale: Optional[torch.Tensor], read_bscale: Optional[torch.Tensor],
                             flushes: Optional[torch.Tensor], state_format: str, state_mode: str, master_format: str,
                             stochastic_rounding: bool, seed: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             g: torch.Tensor, beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                             lower_bound: Optional[float], scale: float, state_batch_indices: torch.Tensor,
                             pad_slot_id: int, plan: list[int], out: torch.Tensor) -> None:
    ckpt = Checkpoint.from_op_args((state, state_scale, state_bscale, read, read_scale, read_bscale, flushes),
                                   spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    ref.state_update_(ckpt, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, state_batch_indices, pad_slot_id,
                      out)


def _state_update_stored_cuda(state, state_scale, state_bscale, read, read_scale, read_bscale, flushes, state_format,
                              state_mode, master_format, stochastic_rounding, seed, q, k, v, g, beta,  # noqa: N803
                              A_log, dt_bias, lower_bound, scale, state_batch_indices, pad_slot_id, plan, out) -> None:
    stored = ((state_scale, state_bscale, read, read_scale, read_bscale, flushes),
              spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    delta.run(True, plan, state, None, None, None, None, None, None, None, q, k, v, g, beta, A_log, dt_bias, scale,
              lower_bound, state_batch_indices, pad_slot_id, out, stored)


_state_update_stored_op = define_op("kda_state_update_stored", (*OP_TENSORS, "out"),
                                    _state_update_stored_cpu, _state_update_stored_cuda)


# ---------------------------------------------------------------------------------------------------- public API
def _validate_step(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, out, state_batch_indices,  # noqa: N803
                   pad_slot_id, window: bool = False):
    """One step's inputs or, with ``window``, a verify window's ([b,T,...]; delta.validate_common)."""
    ref.check_lower_bound(lower_bound)
    idx, out, dims = delta.validate_common(state, q, k, v, out, state_batch_indices, pad_slot_id, window)
    _check_gates(g, beta, A_log, dt_bias, q.shape[:-2], dims[2], dims[4], q.dtype, state.device)
    return idx, out, dims


def _check_gates(g, beta, A_log, dt_bias, lead: tuple[int, ...], HV: int, K: int,  # noqa: N803
                 act_dtype: torch.dtype, dev: torch.device) -> None:
    """g [*lead, HV, K], beta [*lead, HV] (lead: (batch,) or a window's (batch, T)), A_log [HV], dt_bias [HV, K]."""
    chk.check_tensor("g", g, (*lead, HV, K), (act_dtype, torch.float32), dev, dtype_of="q")
    chk.check_tensor("beta", beta, (*lead, HV), (act_dtype, torch.float32), dev, inner_contiguous=0, dtype_of="q")
    chk.check_tensor("A_log", A_log, (HV,), (torch.float32,), dev)
    bias_shape = (HV * K,) if isinstance(dt_bias, torch.Tensor) and dt_bias.dim() == 1 else (HV, K)
    chk.check_tensor("dt_bias", dt_bias, bias_shape, (torch.float32,), dev, inner_contiguous=len(bias_shape))
    if dev.type == "cuda":
        chk.check_aligned("g", g, K // 32)
        chk.check_aligned("dt_bias", dt_bias, K // 32)


def _check_values(idx, state, cursor, L, q, k, v, g, beta, A_log, dt_bias, pad_slot_id) -> None:  # noqa: N803
    chk.check_step_values(idx, state.shape[0], pad_slot_id, cursor, L,
                          rows={"q": q, "k": k, "v": v, "g": g, "beta": beta},
                          params={"A_log": A_log, "dt_bias": dt_bias})


def replay_decode(layer: KDALayerCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                  lower_bound: float | None = None, scale: float | None = None,
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, mode: str = "auto",
                  plan: LaunchPlan | None = None, check_values: bool = False) -> torch.Tensor:
    """One ReplaySSM KDA decode step for a batch of rows at their own cursors; returns ``out`` [b, HV, V].

    ``layer``: a :class:`~trtllm_replayssm.core.cache.KDALayerCache`. ``q, k`` [b,H,K], ``v`` [b,HV,V] (activation
    dtype), raw gate ``g`` [b,HV,K] and beta logits ``beta`` [b,HV] (activation dtype or fp32), ``A_log`` [HV] fp32,
    ``dt_bias`` [HV,K] (or [HV*K]) fp32, ``lower_bound`` (None: plain gate; else a negative log-gate bound).
    ``mode``, ``plan`` and ``check_values`` as ``gdn.replay_decode``.
    """
    if not isinstance(layer, KDALayerCache):
        raise TypeError(f"layer: expected a KDALayerCache, got {type(layer).__name__}")
    state = layer.require_state() if layer.storage is None else layer.checkpoint()
    idx, out, dims = _validate_step(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, out,
                                    state_batch_indices, pad_slot_id)
    delta.validate_rings(layer, dims, q.dtype, True, idx, pad_slot_id)
    if check_values:
        _check_values(idx, state, layer.cursor, layer.buffer_len, q, k, v, g, beta, A_log, dt_bias, pad_slot_id)
    if plan is None:
        plan = replay_plan(layer, q.shape[0], mode=mode)
    else:
        checked_plan(plan, delta.replay_plan_key(layer, q.shape[0], True), mode)
    args = (layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor, layer.arrive, layer.coef, layer.step, q, k, v, g,
            beta, A_log, dt_bias, None if lower_bound is None else float(lower_bound),
            delta.resolve_scale(scale, dims[4]), idx, pad_slot_id, plan.words, out)
    if layer.storage is None:
        _replay_op(layer.state, *args)
    else:
        _replay_stored_op(*state.op_tensors(), *spec_op_args(state.spec), state.seed, *args)
    return out


def state_update(state: torch.Tensor | Checkpoint, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                 beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                 lower_bound: float | None = None, scale: float | None = None,
                 state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                 out: torch.Tensor | None = None, plan: LaunchPlan | None = None,
                 check_values: bool = False) -> torch.Tensor:
    """Baseline KDA step (read state, update, write state) on a slot pool ``state`` [slots,HV,V,K] or a Checkpoint
    (chk.check_stored_state_update); returns ``out``. ``check_values`` as :func:`replay_decode`."""
    idx, out, dims = _validate_step(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, out, state_batch_indices,
                                    pad_slot_id)
    stored = chk.check_stored_state_update(state)
    if check_values:
        _check_values(idx, state, None, 1, q, k, v, g, beta, A_log, dt_bias, pad_slot_id)
    if plan is None:
        plan = state_update_plan(state, q.shape[0], q.dtype)
    else:
        checked_plan(plan, delta.state_update_plan_key(state, q.shape[0], q.dtype, True))
    args = (q, k, v, g, beta, A_log, dt_bias, None if lower_bound is None else float(lower_bound),
            delta.resolve_scale(scale, dims[4]), idx, pad_slot_id, plan.words, out)
    if stored:
        _state_update_stored_op(*state.op_tensors(), *spec_op_args(state.spec), state.seed, *args)
    else:
        _state_update_op(state.master.data if isinstance(state, Checkpoint) else state, *args)
    return out


# ---------------------------------------------------------------------------------------------------- speculative
def _verify_cpu(state: torch.Tensor, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
                cursor: torch.Tensor, arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
                dt_bias: torch.Tensor, lower_bound: Optional[float], scale: float, state_batch_indices: torch.Tensor,
                pad_slot_id: int, plan: list[int], out: torch.Tensor) -> None:
    # The float32 reference (coef/step are GPU-only scratch).
    ref.verify_step_(state, u_ring, k_ring, g_ring, cursor, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale,
                     state_batch_indices, pad_slot_id, out)


def _verify_cuda(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, g, beta, A_log,  # noqa: N803
                 dt_bias, lower_bound, scale, state_batch_indices, pad_slot_id, plan, out) -> None:
    delta.run_verify(True, plan, state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, g, beta, A_log,
                     dt_bias, scale, lower_bound, state_batch_indices, pad_slot_id, out)


_verify_op = define_op("kda_verify_decode",
                       ("state", "u_ring", "k_ring", "g_ring", "cursor", "arrive", "coef", "step", "out"),
                       _verify_cpu, _verify_cuda)


def _per_draft_cpu(state: torch.Tensor, inter: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   g: torch.Tensor, beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                   lower_bound: Optional[float], scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int,
                   rows_per_cta: int, out: torch.Tensor) -> None:
    ref.per_draft_verify_(state, inter, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale, state_batch_indices,
                          pad_slot_id, out)


def _per_draft_cuda(state, inter, q, k, v, g, beta, A_log, dt_bias, lower_bound, scale,  # noqa: N803
                    state_batch_indices, pad_slot_id, rows_per_cta, out) -> None:
    delta.run_per_draft(True, state, inter, q, k, v, g, beta, A_log, dt_bias, scale, lower_bound, state_batch_indices,
                        pad_slot_id, rows_per_cta, out)


_per_draft_op = define_op("kda_per_draft_verify", ("inter", "out"), _per_draft_cpu, _per_draft_cuda)


def verify_decode(layer: KDALayerCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor,
                  beta: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                  lower_bound: float | None = None, scale: float | None = None,
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, tuning: Tuning = delta.VERIFY_TUNING,
                  plan: LaunchPlan | None = None) -> torch.Tensor:
    """Speculative verify of a window of T tokens per row, as ``gdn.verify_decode`` (``tuning``, ``plan`` too);
    returns ``out`` [b,T,HV,V].
    ``q, k`` [b,T,H,K], ``v`` [b,T,HV,V], raw gate ``g`` [b,T,HV,K] and beta logits ``beta`` [b,T,HV] (activation
    dtype or fp32), ``A_log`` [HV], ``dt_bias`` [HV,K] (or [HV*K]) fp32, ``lower_bound`` as :func:`replay_decode`."""
    if not isinstance(layer, KDALayerCache):
        raise TypeError(f"layer: expected a KDALayerCache, got {type(layer).__name__}")
    delta.check_plain_for_kernels(layer, "kda.verify_decode")
    state = layer.require_state() if layer.storage is None else layer.checkpoint()
    idx, out, dims = _validate_step(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, out,
                                    state_batch_indices, pad_slot_id,
                                    window=True)
    check_window(q.shape[1], layer.buffer_len)
    delta.validate_rings(layer, dims, q.dtype, True, idx, pad_slot_id, replay_cursor=False)
    scale = delta.resolve_scale(scale, dims[4])
    lower_bound = None if lower_bound is None else float(lower_bound)
    if layer.storage is not None:
        ref.verify_step_(state, layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor, q, k, v, g, beta, A_log,
                         dt_bias, lower_bound, scale, idx, pad_slot_id, out)
        return out
    plan = delta.resolved_verify_plan(layer, v, tuning, plan)
    _verify_op(layer.state, layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor, layer.arrive,
               delta.verify_scratch(layer, q.shape[0], q.shape[1]), layer.step, q, k, v, g, beta, A_log, dt_bias,
               lower_bound, scale, idx, pad_slot_id, plan.words, out)
    return out


def per_draft_verify_decode(state: torch.Tensor, inter: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
                            dt_bias: torch.Tensor, lower_bound: float | None = None, scale: float | None = None,
                            state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-draft-state verify (the speculative baseline), as ``gdn.per_draft_verify_decode`` with the inputs of
    :func:`verify_decode`; returns ``out`` [b,T,HV,V]."""
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"state: expected a torch.Tensor slot pool, got {type(state).__name__}")
    idx, out, dims = _validate_step(state, q, k, v, g, beta, A_log, dt_bias, lower_bound, out,
                                    state_batch_indices, pad_slot_id,
                                    window=True)
    delta.check_inter(inter, state, *q.shape[:2])
    _per_draft_op(state, inter, q, k, v, g, beta, A_log, dt_bias, None if lower_bound is None else float(lower_bound),
                  delta.resolve_scale(scale, dims[4]), idx, pad_slot_id, delta.window_tile(state, q.shape[0]), out)
    return out


per_draft_commit = delta.per_draft_commit
