"""Gated DeltaNet decode ops: ``torch.ops.replayssm.gdn_replay_decode`` and ``torch.ops.replayssm.gdn_state_update``.

The custom ops mutate their cache/output arguments in place and return nothing (CUDA-graph capturable, with fake
impls for torch.compile). CUDA tensors run ``plugins/delta_rule_decode.cu`` (KDA=0) with the launch plan they are
given; CPU tensors run the float32 reference (``core/reference/gdn.py``), which is also the CPU fallback. Callers use
:func:`replay_decode` and :func:`state_update`, which validate arguments before any launch.

In-kernel math (as the reference): q, k l2-normalised (``x / sqrt(sum x^2 + 1e-6)``), ``scale`` (default K^-0.5) on q,
``g = -exp(A_log) softplus(a + dt_bias)`` (threshold 20) clamped to -128, ``beta = sigmoid(b)``. The gate ring holds
the cumulative log-gate, so every decay factor has a non-positive exponent: no gate value can overflow.
"""
from __future__ import annotations

import torch

from typing import Optional

from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core.cache import GDNLayerCache, KDALayerCache
from trtllm_replayssm.core.checkpoint import OP_TENSORS, Checkpoint, spec_of_op_args, spec_op_args
from trtllm_replayssm.core.dims import GDNDims
from trtllm_replayssm.core.jit.configs import KernelConfig
from trtllm_replayssm.core.ops import delta
from trtllm_replayssm.core.ops.launch import define_op
from trtllm_replayssm.core.ops.spec import check_window
from trtllm_replayssm.core.plans import Device, Launch, LaunchPlan, Tuning, checked_plan
from trtllm_replayssm.core.reference import gdn as ref


def replay_plan(layer: GDNLayerCache, batch: int, mode: str = "auto", tuning: Tuning = delta.DEFAULT_TUNING,
                device: Device | None = None) -> LaunchPlan:
    """The launch plan of :func:`replay_decode` for ``batch`` rows of ``layer`` (``device``: the layer's GPU)."""
    return delta.replay_plan(layer, batch, False, mode, tuning, device)


def state_update_plan(state: torch.Tensor, batch: int, act_dtype: torch.dtype, tuning: Tuning = delta.DEFAULT_TUNING,
                      device: Device | None = None) -> LaunchPlan:
    """The launch plan of :func:`state_update` for ``batch`` rows of the pool ``state`` [slots, HV, V, K]."""
    return delta.state_update_plan(state, batch, act_dtype, False, tuning, device)


def kernel_configs(dims: GDNDims, state_dtype: torch.dtype, act_dtype: torch.dtype) -> list[KernelConfig]:
    """Every module a layer of ``dims`` can launch at any batch size (all row tiles)."""
    return delta.kernel_configs(False, dims.head_k_dim, dims.head_v_dim, state_dtype, act_dtype)


# ---------------------------------------------------------------------------------------------------- custom ops
def _replay_cpu(state: torch.Tensor, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
                cursor: torch.Tensor, arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
                dt_bias: torch.Tensor, scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int,
                plan: list[int], out: torch.Tensor) -> None:
    ref.replay_step_(state, u_ring, k_ring, g_ring, cursor, q, k, v, a, b, A_log, dt_bias, scale,
                     state_batch_indices, pad_slot_id, Launch.from_words(plan).mode == "flush", out)


def _replay_cuda(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, a, b, A_log, dt_bias,  # noqa: N803
                 scale, state_batch_indices, pad_slot_id, plan, out) -> None:
    delta.run(False, plan, state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, a, b, A_log, dt_bias,
              scale, None, state_batch_indices, pad_slot_id, out)


_replay_op = define_op("gdn_replay_decode",
                       ("state", "u_ring", "k_ring", "g_ring", "cursor", "arrive", "coef", "step", "out"),
                       _replay_cpu, _replay_cuda)


def _state_update_cpu(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                      b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float,  # noqa: N803
                      state_batch_indices: torch.Tensor, pad_slot_id: int, plan: list[int], out: torch.Tensor) -> None:
    ref.state_update_(state, q, k, v, a, b, A_log, dt_bias, scale, state_batch_indices, pad_slot_id, out)


def _state_update_cuda(state, q, k, v, a, b, A_log, dt_bias, scale, state_batch_indices, pad_slot_id, plan,  # noqa: N803
                       out) -> None:
    delta.run(False, plan, state, None, None, None, None, None, None, None, q, k, v, a, b, A_log, dt_bias, scale,
              None, state_batch_indices, pad_slot_id, out)


_state_update_op = define_op("gdn_state_update", ("state", "out"), _state_update_cpu, _state_update_cuda)


# Stored checkpoints (quantized, dual or stochastically rounded): the same steps over a Checkpoint's tensors
# (Checkpoint.op_tensors, checkpoint.spec_op_args and the seed ahead of the plain ops' arguments).
def _replay_stored_cpu(state: torch.Tensor, state_scale: Optional[torch.Tensor], state_bscale: Optional[torch.Tensor],
                       read: Optional[torch.Tensor], read_scale: Optional[torch.Tensor],
                       read_bscale: Optional[torch.Tensor], flushes: Optional[torch.Tensor], state_format: str,
                       state_mode: str, master_format: str, stochastic_rounding: bool, seed: int,
                       u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor, cursor: torch.Tensor,
                       arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                       v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
                       dt_bias: torch.Tensor, scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int,
                       plan: list[int], out: torch.Tensor) -> None:
    ckpt = Checkpoint.from_op_args((state, state_scale, state_bscale, read, read_scale, read_bscale, flushes),
                                   spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    _replay_cpu(ckpt, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, a, b, A_log, dt_bias, scale,
                state_batch_indices, pad_slot_id, plan, out)


def _replay_stored_cuda(state, state_scale, state_bscale, read, read_scale, read_bscale, flushes, state_format,
                        state_mode, master_format, stochastic_rounding, seed, u_ring, k_ring, g_ring, cursor, arrive,
                        coef, step, q, k, v, a, b, A_log, dt_bias, scale, state_batch_indices, pad_slot_id,  # noqa: N803
                        plan, out) -> None:
    stored = ((state_scale, state_bscale, read, read_scale, read_bscale, flushes),
              spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    delta.run(False, plan, state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, a, b, A_log, dt_bias,
              scale, None, state_batch_indices, pad_slot_id, out, stored)


_replay_stored_op = define_op("gdn_replay_decode_stored",
                              (*OP_TENSORS, "u_ring", "k_ring", "g_ring", "cursor", "arrive", "coef", "step", "out"),
                              _replay_stored_cpu, _replay_stored_cuda)


def _state_update_stored_cpu(state: torch.Tensor, state_scale: Optional[torch.Tensor],
                             state_bscale: Optional[torch.Tensor], read: Optional[torch.Tensor],
                             read_scale: Optional[torch.Tensor], read_bscale: Optional[torch.Tensor],
                             flushes: Optional[torch.Tensor], state_format: str, state_mode: str, master_format: str,
                             stochastic_rounding: bool, seed: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                             a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                             scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int, plan: list[int],
                             out: torch.Tensor) -> None:
    ckpt = Checkpoint.from_op_args((state, state_scale, state_bscale, read, read_scale, read_bscale, flushes),
                                   spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    ref.state_update_(ckpt, q, k, v, a, b, A_log, dt_bias, scale, state_batch_indices, pad_slot_id, out)


def _state_update_stored_cuda(state, state_scale, state_bscale, read, read_scale, read_bscale, flushes, state_format,
                              state_mode, master_format, stochastic_rounding, seed, q, k, v, a, b, A_log,  # noqa: N803
                              dt_bias, scale, state_batch_indices, pad_slot_id, plan, out) -> None:
    stored = ((state_scale, state_bscale, read, read_scale, read_bscale, flushes),
              spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    delta.run(False, plan, state, None, None, None, None, None, None, None, q, k, v, a, b, A_log, dt_bias, scale,
              None, state_batch_indices, pad_slot_id, out, stored)


_state_update_stored_op = define_op("gdn_state_update_stored", (*OP_TENSORS, "out"),
                                    _state_update_stored_cpu, _state_update_stored_cuda)


# ---------------------------------------------------------------------------------------------------- public API
def _validate_step(state, q, k, v, a, b, A_log, dt_bias, out, state_batch_indices, pad_slot_id,  # noqa: N803
                   window: bool = False):
    """One step's inputs (a, b [b,HV]) or, with ``window``, a verify window's ([b,T,HV]; delta.validate_common)."""
    idx, out, dims = delta.validate_common(state, q, k, v, out, state_batch_indices, pad_slot_id, window)
    HV, dev, lead = dims[2], state.device, q.shape[:-2]
    chk.check_tensor("a", a, (*lead, HV), (q.dtype, torch.float32), dev, inner_contiguous=0, dtype_of="q")
    chk.check_tensor("b", b, (*lead, HV), (q.dtype, torch.float32), dev, inner_contiguous=0, dtype_of="q")
    chk.check_tensor("A_log", A_log, (HV,), (torch.float32,), dev)
    chk.check_tensor("dt_bias", dt_bias, (HV,), (torch.float32,), dev)
    return idx, out, dims


def _check_values(idx, state, cursor, L, q, k, v, a, b, A_log, dt_bias, pad_slot_id) -> None:  # noqa: N803
    chk.check_step_values(idx, state.shape[0], pad_slot_id, cursor, L, rows={"q": q, "k": k, "v": v, "a": a, "b": b},
                          params={"A_log": A_log, "dt_bias": dt_bias})


def replay_decode(layer: GDNLayerCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                  b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None = None,  # noqa: N803
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, mode: str = "auto",
                  plan: LaunchPlan | None = None, check_values: bool = False) -> torch.Tensor:
    """One ReplaySSM GDN decode step for a batch of rows at their own cursors; returns ``out`` [b, HV, V].

    ``layer``: a :class:`~trtllm_replayssm.core.cache.GDNLayerCache`. ``q, k`` [b,H,K], ``v`` [b,HV,V] (activation
    dtype), raw ``a, b`` [b,HV] (activation dtype or fp32), ``A_log, dt_bias`` [HV] fp32. ``mode``: ``auto`` (flush
    every step when the batch cannot fill the GPU), ``replay`` or ``flush``. ``plan``: what to launch (default
    ``replay_plan(layer, batch, mode=mode)``). ``check_values``: also check slot ids, cursors and finite inputs on
    CUDA (syncs; debugging). Rows the step skips and the NaN/Inf policy: docs/design.md.
    """
    if not isinstance(layer, GDNLayerCache) or isinstance(layer, KDALayerCache):
        raise TypeError(f"layer: expected a GDNLayerCache, got {type(layer).__name__}")
    state = layer.require_state() if layer.storage is None else layer.checkpoint()
    idx, out, dims = _validate_step(state, q, k, v, a, b, A_log, dt_bias, out, state_batch_indices, pad_slot_id)
    delta.validate_rings(layer, dims, q.dtype, False, idx, pad_slot_id)
    if check_values:
        _check_values(idx, state, layer.cursor, layer.buffer_len, q, k, v, a, b, A_log, dt_bias, pad_slot_id)
    if plan is None:
        plan = replay_plan(layer, q.shape[0], mode=mode)
    else:
        checked_plan(plan, delta.replay_plan_key(layer, q.shape[0], False), mode)
    args = (layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor, layer.arrive, layer.coef, layer.step, q, k, v, a,
            b, A_log, dt_bias, delta.resolve_scale(scale, dims[4]), idx, pad_slot_id, plan.words, out)
    if layer.storage is None:
        _replay_op(layer.state, *args)
    else:
        _replay_stored_op(*state.op_tensors(), *spec_op_args(state.spec), state.seed, *args)
    return out


def state_update(state: torch.Tensor | Checkpoint, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                 b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None = None,  # noqa: N803
                 state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                 out: torch.Tensor | None = None, plan: LaunchPlan | None = None,
                 check_values: bool = False) -> torch.Tensor:
    """Baseline GDN step (read state, update, write state) on a slot pool ``state`` [slots,HV,V,K] or a Checkpoint
    (chk.check_stored_state_update); returns ``out``. ``plan``: what to launch (default ``state_update_plan(state,
    batch, q.dtype)``); ``check_values`` as :func:`replay_decode`."""
    idx, out, dims = _validate_step(state, q, k, v, a, b, A_log, dt_bias, out, state_batch_indices, pad_slot_id)
    stored = chk.check_stored_state_update(state)
    if check_values:
        _check_values(idx, state, None, 1, q, k, v, a, b, A_log, dt_bias, pad_slot_id)
    if plan is None:
        plan = state_update_plan(state, q.shape[0], q.dtype)
    else:
        checked_plan(plan, delta.state_update_plan_key(state, q.shape[0], q.dtype, False))
    args = (q, k, v, a, b, A_log, dt_bias, delta.resolve_scale(scale, dims[4]), idx, pad_slot_id, plan.words, out)
    if stored:
        _state_update_stored_op(*state.op_tensors(), *spec_op_args(state.spec), state.seed, *args)
    else:
        _state_update_op(state.master.data if isinstance(state, Checkpoint) else state, *args)
    return out


# ---------------------------------------------------------------------------------------------------- speculative
def _verify_cpu(state: torch.Tensor, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
                cursor: torch.Tensor, arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor, q: torch.Tensor,
                k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
                dt_bias: torch.Tensor, scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int,
                plan: list[int], out: torch.Tensor) -> None:
    # The float32 reference (coef/step are GPU-only scratch).
    ref.verify_step_(state, u_ring, k_ring, g_ring, cursor, q, k, v, a, b, A_log, dt_bias, scale,
                     state_batch_indices, pad_slot_id, out)


def _verify_cuda(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, a, b, A_log,  # noqa: N803
                 dt_bias, scale, state_batch_indices, pad_slot_id, plan, out) -> None:
    delta.run_verify(False, plan, state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, a, b, A_log,
                     dt_bias, scale, None, state_batch_indices, pad_slot_id, out)


_verify_op = define_op("gdn_verify_decode",
                       ("state", "u_ring", "k_ring", "g_ring", "cursor", "arrive", "coef", "step", "out"),
                       _verify_cpu, _verify_cuda)


def _per_draft_cpu(state: torch.Tensor, inter: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor,  # noqa: N803
                   scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int, rows_per_cta: int,
                   out: torch.Tensor) -> None:
    ref.per_draft_verify_(state, inter, q, k, v, a, b, A_log, dt_bias, scale, state_batch_indices, pad_slot_id, out)


def _per_draft_cuda(state, inter, q, k, v, a, b, A_log, dt_bias, scale, state_batch_indices, pad_slot_id,  # noqa: N803
                    rows_per_cta, out) -> None:
    delta.run_per_draft(False, state, inter, q, k, v, a, b, A_log, dt_bias, scale, None, state_batch_indices,
                        pad_slot_id, rows_per_cta, out)


_per_draft_op = define_op("gdn_per_draft_verify", ("inter", "out"), _per_draft_cpu, _per_draft_cuda)


def verify_decode(layer: GDNLayerCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                  b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None = None,  # noqa: N803
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, tuning: Tuning = delta.VERIFY_TUNING,
                  plan: LaunchPlan | None = None) -> torch.Tensor:
    """Speculative verify of a window of T tokens per row (docs/algorithm.md, beyond standard decode); returns
    ``out`` [b,T,HV,V]. ``q, k`` [b,T,H,K], ``v`` [b,T,HV,V], ``a, b`` [b,T,HV] (activation dtype or fp32), ``A_log,
    dt_bias`` [HV] fp32. Token t is decoded from the checkpoint, the row's committed history (``core/spec_cursor.py``)
    and the window's earlier tokens, the history first folded into the checkpoint when the ring would overrun; the
    window's records go past the history. Follow it with ``spec.commit(layer, accepted, ..., window=T)``. The layer's
    rings hold at least 2T records; on CUDA a row whose cursor word is not valid for T is skipped (zero outputs).
    ``plan``: what to launch (default ``delta.verify_plan(layer, batch, T, tuning)``)."""
    if not isinstance(layer, GDNLayerCache) or isinstance(layer, KDALayerCache):
        raise TypeError(f"layer: expected a GDNLayerCache, got {type(layer).__name__}")
    delta.check_plain_for_kernels(layer, "gdn.verify_decode")
    state = layer.require_state() if layer.storage is None else layer.checkpoint()
    idx, out, dims = _validate_step(state, q, k, v, a, b, A_log, dt_bias, out, state_batch_indices,
                                    pad_slot_id, window=True)
    check_window(q.shape[1], layer.buffer_len)
    delta.validate_rings(layer, dims, q.dtype, False, idx, pad_slot_id, replay_cursor=False)
    scale = delta.resolve_scale(scale, dims[4])
    if layer.storage is not None:
        ref.verify_step_(state, layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor, q, k, v, a, b, A_log, dt_bias,
                         scale, idx, pad_slot_id, out)
        return out
    plan = delta.resolved_verify_plan(layer, v, tuning, plan)
    _verify_op(layer.state, layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor, layer.arrive,
               delta.verify_scratch(layer, q.shape[0], q.shape[1]), layer.step, q, k, v, a, b, A_log, dt_bias, scale,
               idx, pad_slot_id, plan.words, out)
    return out


def per_draft_verify_decode(state: torch.Tensor, inter: torch.Tensor, q: torch.Tensor, k: torch.Tensor,
                            v: torch.Tensor, a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor,  # noqa: N803
                            dt_bias: torch.Tensor, scale: float | None = None,
                            state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                            out: torch.Tensor | None = None) -> torch.Tensor:
    """Per-draft-state verify (the speculative baseline): the window's tokens (as :func:`verify_decode`) as baseline
    steps from the slot pool ``state`` [slots,HV,V,K], which is not written; the state after token t goes to
    ``inter`` [b,T,HV,V,K] (state dtype). Returns ``out`` [b,T,HV,V]; :func:`per_draft_commit` keeps a draft."""
    if not isinstance(state, torch.Tensor):
        raise TypeError(f"state: expected a torch.Tensor slot pool, got {type(state).__name__}")
    idx, out, dims = _validate_step(state, q, k, v, a, b, A_log, dt_bias, out, state_batch_indices,
                                    pad_slot_id, window=True)
    delta.check_inter(inter, state, *q.shape[:2])
    _per_draft_op(state, inter, q, k, v, a, b, A_log, dt_bias, delta.resolve_scale(scale, dims[4]), idx, pad_slot_id,
                  delta.window_tile(state, q.shape[0]), out)
    return out


per_draft_commit = delta.per_draft_commit
