"""Gated DeltaNet decode ops: ``torch.ops.replayssm.gdn_replay_decode`` and ``torch.ops.replayssm.gdn_state_update``.

The custom ops mutate their cache/output arguments in place and return nothing (CUDA-graph capturable, with fake
impls for torch.compile). CUDA tensors run the NVRTC-compiled kernels of ``plugins/delta_rule_decode.cu`` (KDA=0) on
the current stream; CPU tensors run the float32 reference (``reference/gdn.py``), which is also the CPU fallback.
Callers use :func:`replay_decode` and :func:`state_update`, which validate arguments before any launch.

In-kernel math (as the reference): q, k l2-normalised (``x / sqrt(sum x^2 + 1e-6)``), ``scale`` (default K^-0.5) on q,
``g = -exp(A_log) softplus(a + dt_bias)`` (threshold 20) clamped to -128, ``beta = sigmoid(b)``. The gate ring holds
the cumulative log-gate, so every decay factor has a non-positive exponent: no gate value can overflow.

The launch helpers here (parameter struct, tile choice, shared validation) also serve ``ops/kda.py``.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Optional

import torch

from trtllm_replayssm.core.cache import GDNLayerCache, KDALayerCache, delta_record_len
from trtllm_replayssm.core.jit.configs import NUM_WARPS, gdn_config, kda_config, tile_choices
from trtllm_replayssm.core.jit.loader import get_kernel, launch, prefer_max_shared
from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core.ops.launch import (FOLD_FIRST_MIN_STAGES, fitting_tiles, force_flush_for,
                                          launch_persistent, launch_prep, make_struct, persistent_ctas_per_sm, ptr,
                                          require_persistent_arch, rows_per_cta, stages_for, step_rows, stride)
from trtllm_replayssm.core.reference import gdn as ref

_P = ctypes.c_void_p
_I64 = ctypes.c_longlong
_I32 = ctypes.c_int
_F32 = ctypes.c_float
# Mirrors `struct DeltaParams` in plugins/delta_rule_decode.cu (same order; natural alignment).
_DeltaParams = make_struct("DeltaParams", [
    ("state", _P), ("u_ring", _P), ("k_ring", _P), ("g_ring", _P), ("cursor", _P), ("arrive", _P),
    ("coef", _P), ("step", _P), ("q", _P), ("k", _P), ("v", _P), ("gate", _P), ("beta", _P),
    ("A_log", _P), ("dt_bias", _P),
    ("slot_idx", _P), ("out", _P),
    ("s_state_slot", _I64), ("s_state_head", _I64),
    ("s_ur_slot", _I64), ("s_ur_head", _I64), ("s_kr_slot", _I64), ("s_kr_head", _I64),
    ("s_gr_slot", _I64), ("s_gr_head", _I64), ("s_coef_row", _I64),
    ("s_q_b", _I64), ("s_q_h", _I64), ("s_k_b", _I64), ("s_k_h", _I64), ("s_v_b", _I64), ("s_v_h", _I64),
    ("s_gate_b", _I64), ("s_gate_h", _I64), ("s_beta_b", _I64), ("s_beta_h", _I64), ("s_out_b", _I64),
    ("s_out_h", _I64),
    ("scale", _F32), ("lower_bound", _F32),
    ("num_k_heads", _I32), ("num_v_heads", _I32), ("L", _I32), ("pad_slot_id", _I32),
    ("gate_is_f32", _I32), ("beta_is_f32", _I32), ("has_lower_bound", _I32), ("force_flush", _I32),
    ("batch", _I32), ("stages", _I32), ("stage_bytes", _I32), ("fold_bytes", _I32), ("tail_start", _I32),
])

SUPPORTED_KEY_DIMS = (64, 128, 256)
MAX_ROWS_PER_CTA = 128  # one output lane per row: at most 32 rows per warp
# Optional per-process override of the row tile (benchmark sweeps); None = heuristic. Shared by GDN and KDA.
ROWS_PER_CTA_OVERRIDE: Optional[int] = None
# Share of the replay main kernel's tiles claimed at run time with fp32 states (ops._launch.tail_start; None: all
# round-robin). H200, batch 256, against None: Qwen3.5-4B 155.3 -> 152.5 us, Qwen3.5-122B 298.7 -> 292.2, Kimi-Linear
# 168.9 -> 165.6, GLM-5.3-Flash 340.3 -> 325.7; 0.25 slowed Kimi (benchmarks/results/dev/sweep-s11-{3,4}-*.log,
# sweep-s12-*.log). Shared by GDN and KDA.
TAIL_FRACTION: float | None = 0.1


def tail_fraction(state_dtype: torch.dtype) -> float | None:
    """The claimed share of the main kernel's tiles for ``state_dtype``: TAIL_FRACTION for 4-byte states, None for
    16-bit states, whose kernels keep the round-robin schedule (plugins/delta_rule_decode.cu kTailClaims)."""
    return TAIL_FRACTION if state_dtype.itemsize == 4 else None


def fill_params(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, gate, beta, A_log, dt_bias,
                scale: float, lower_bound: float | None, idx, pad_slot_id: int, force_flush: bool,
                out) -> ctypes.Structure:
    """The kernel parameter struct (``u_ring`` None for the baseline kernel)."""
    L = u_ring.shape[2] if u_ring is not None else 1
    return _DeltaParams(
        ptr(state), ptr(u_ring), ptr(k_ring), ptr(g_ring), ptr(cursor), ptr(arrive), ptr(coef), step_rows(step),
        ptr(q), ptr(k), ptr(v), ptr(gate), ptr(beta), ptr(A_log), ptr(dt_bias), ptr(idx), ptr(out),
        state.stride(0), state.stride(1), stride(u_ring, 0), stride(u_ring, 1), stride(k_ring, 0), stride(k_ring, 1),
        stride(g_ring, 0), stride(g_ring, 1), stride(coef, 0),
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), gate.stride(0), gate.stride(1),
        beta.stride(0), beta.stride(1), out.stride(0), out.stride(1),
        float(scale), 0.0 if lower_bound is None else float(lower_bound),
        q.shape[1], v.shape[1], L, pad_slot_id,
        int(gate.dtype == torch.float32), int(beta.dtype == torch.float32), int(lower_bound is not None),
        int(force_flush), q.shape[0], 0, 0, 0, 0)


def row_tile(value_dim: int, key_dim: int, work_items: int, device: torch.device) -> int:
    """Rows per CTA: the shared launch heuristic, capped at MAX_ROWS_PER_CTA."""
    tile = rows_per_cta(value_dim, key_dim, work_items, device, ROWS_PER_CTA_OVERRIDE)
    if tile > MAX_ROWS_PER_CTA:
        raise ValueError(f"rows_per_cta: expected at most {MAX_ROWS_PER_CTA} rows per CTA, got {tile}")
    return tile


def stage_bytes(L: int, rows: int, key_dim: int, state_elem: int, act_elem: int, per_channel_gate: bool) -> int:
    """Bytes of one shared-memory stage of the persistent replay kernel: the (rows x K) checkpoint tile, slot/step,
    the record, v of the rows, the raw q and k rows and L u-ring rows (mirrors
    plugins/delta_rule_decode.cu:stage_layout)."""
    r16 = lambda n: (n + 15) // 16 * 16  # noqa: E731
    total = rows * key_dim * state_elem + 16 + r16(delta_record_len(L, key_dim, per_channel_gate) * 4) \
        + r16(rows * act_elem) + r16(2 * key_dim * act_elem) + r16(L * rows * act_elem)
    return (total + 127) // 128 * 128


def fold_bytes(L: int, key_dim: int, key_elem: int, per_channel_gate: bool) -> int:
    """Bytes of the persistent replay kernel's fold buffer: a flush tile's ring keys [L][K] (``key_elem`` bytes each)
    and, for GDN, its cumulative gates [L] fp32 (KDA's pre-decayed keys need none) (mirrors
    plugins/delta_rule_decode.cu:fold_gates_offset)."""
    r16 = lambda n: (n + 15) // 16 * 16  # noqa: E731
    return r16(L * key_dim * key_elem) + (0 if per_channel_gate else r16(L * 4))


def key_ring_elem(act_dtype: torch.dtype, per_channel_gate: bool) -> int:
    """Bytes of one key ring element (reference/gdn.py key_ring_dtype)."""
    return ref.key_ring_dtype(act_dtype, per_channel_gate).itemsize


def _replay_tile(value_dim: int, key_dim: int, L: int, state: torch.Tensor, v: torch.Tensor, work: int,
                 per_channel_gate: bool) -> int:
    """Row tile of the replay: the launch heuristic's, lowered until two stages fit per CTA (KDA: and the fold
    buffer with them)."""
    tile = row_tile(value_dim, key_dim, work, v.device)
    if ROWS_PER_CTA_OVERRIDE is not None:
        return tile
    return _fitting_tile(value_dim, key_dim, L, state.element_size(), v.element_size(), tile, per_channel_gate,
                         persistent_ctas_per_sm(), key_ring_elem(v.dtype, per_channel_gate))


@functools.lru_cache(maxsize=None)
def _fitting_tile(value_dim: int, key_dim: int, L: int, state_elem: int, act_elem: int, tile: int,
                  per_channel_gate: bool, ctas_per_sm: int, key_elem: int) -> int:
    stage = {t: stage_bytes(L, t, key_dim, state_elem, act_elem, per_channel_gate)
             for t in tile_choices(value_dim, key_dim)}
    fits = fitting_tiles(stage, tile, act_elem, ctas_per_sm)
    if not fits:
        return tile
    if per_channel_gate:  # a KDA fold without the buffer loads its keys itself: worth a smaller tile (measured)
        fold = fold_bytes(L, key_dim, key_elem, True)
        buffered = [t for t in fits if stages_for(stage[t], ctas_per_sm, fold) >= FOLD_FIRST_MIN_STAGES]
        if buffered:
            return max(buffered)
    return max(fits)


def launch_delta(family: str, kernel_names: tuple[str, ...], params: ctypes.Structure, state: torch.Tensor,
                 q: torch.Tensor, v: torch.Tensor) -> None:
    """Launch delta-rule kernels in order: ``*_prep_kernel`` (a warp per (row, key head) for GDN, per (row, value
    head) for KDA), the state kernels on (V / tile, HV, batch) CTAs, ``*_main_kernel`` persistent (a few CTAs per SM
    streaming (tile x K) state tiles and their inputs through shared memory) as a programmatic dependent launch of
    the prep kernel."""
    batch, v_heads, value_dim = v.shape
    key_dim = q.shape[2]
    replay = any(name.endswith("_main_kernel") for name in kernel_names)
    tile = (_replay_tile(value_dim, key_dim, params.L, state, v, batch * v_heads, family == "kda") if replay
            else row_tile(value_dim, key_dim, batch * v_heads, v.device))
    make = gdn_config if family == "gdn" else kda_config
    config = make(key_dim, value_dim, state.dtype, q.dtype, tile)
    block = (32 * NUM_WARPS, 1, 1)
    for name in kernel_names:
        function = get_kernel(config, name, v.device)
        if name.endswith("_prep_kernel"):  # one warp per (batch row, key head) (GDN) or (batch row, value head) (KDA)
            items = batch * (v_heads if family == "kda" else q.shape[1])
            prefer_max_shared(function)  # the main kernel's carveout: an SM need not drain between the two
            launch_prep(function, (-(-items // NUM_WARPS), 1, 1), block, params)
        elif name.endswith("_main_kernel"):
            params.stage_bytes = stage_bytes(params.L, tile, key_dim, state.element_size(), v.element_size(),
                                             family == "kda")
            launch_persistent(function, params, batch * v_heads * (value_dim // tile), v.device,
                              fold_bytes(params.L, key_dim, key_ring_elem(v.dtype, family == "kda"), family == "kda"),
                              tail_fraction(state.dtype), family == "kda")
        else:
            launch(function, (value_dim // tile, v_heads, batch), block, params)


def replay_kernels(force_flush: bool, device: torch.device) -> tuple[str, ...]:
    """Kernels of one replay step: the flush kernel in the adaptive flush mode, else prep + main (sm_90+)."""
    if not force_flush:
        require_persistent_arch(device, "delta-rule replay decode")
    return ("delta_flush_decode_kernel",) if force_flush else ("delta_replay_prep_kernel", "delta_replay_main_kernel")


def resolve_scale(scale: float | None, key_dim: int) -> float:
    """``scale`` as a finite float (default ``key_dim ** -0.5``)."""
    value = ref.resolve_scale(scale, key_dim)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"scale: expected a finite float, got {scale}")
    return value


def validate_common(state: torch.Tensor, q, k, v, out, state_batch_indices, pad_slot_id) -> tuple:
    """Checks shared by GDN and KDA; returns ``(idx, out, dims)`` with dims = (slots, H, HV, V, K)."""
    chk.check_tensor("state", state, (None, None, None, None), chk.FLOAT_DTYPES, inner_contiguous=2)
    slots, HV, V, K = state.shape
    dev = state.device
    if K not in SUPPORTED_KEY_DIMS:
        raise ValueError(f"state: key dim (last dim) must be one of {SUPPORTED_KEY_DIMS}, got {K}")
    if V % NUM_WARPS:
        raise ValueError(f"state: value dim (dim 2) must be a multiple of {NUM_WARPS}, got {V}")
    if isinstance(pad_slot_id, bool) or not isinstance(pad_slot_id, int):
        raise TypeError(f"pad_slot_id: expected an int, got {type(pad_slot_id).__name__}")
    chk.check_tensor("q", q, (None, None, K), chk.ACT_DTYPES, dev)
    batch, H = q.shape[:2]
    if H == 0 or HV % H:
        raise ValueError(f"q: key heads (dim 1) must divide the value heads of the state ({HV}), got {H}")
    chk.check_tensor("k", k, (batch, H, K), (q.dtype,), dev)
    chk.check_tensor("v", v, (batch, HV, V), (q.dtype,), dev)
    if out is None:
        out = torch.empty_like(v)
    chk.check_tensor("out", out, (batch, HV, V), (q.dtype,), dev)
    if dev.type == "cuda":
        epl = K // 32
        for name, t in (("state", state), ("q", q), ("k", k)):
            chk.check_aligned(name, t, epl)
    idx = chk.slot_indices("state_batch_indices", state_batch_indices, batch, slots, pad_slot_id, dev)
    return idx, out, (slots, H, HV, V, K)


def validate_rings(layer: GDNLayerCache, dims: tuple, act_dtype: torch.dtype, per_channel_gate: bool,
                   batch: int) -> None:
    """Ring/cursor/scratch tensors of ``layer`` against the step's dims (slots, H, HV, V, K) and batch."""
    slots, H, HV, V, K = dims
    chk.check_scratch_rows(batch, slots)
    L, dev = layer.buffer_len, layer.state.device
    chk.check_tensor("layer.u_ring", layer.u_ring, (slots, HV, L, V), (act_dtype,), dev, inner_contiguous=2)
    key_heads = HV if per_channel_gate else H  # KDA: one pre-decayed key per value head
    chk.check_tensor("layer.k_ring", layer.k_ring, (slots, key_heads, L, K), (ref.key_ring_dtype(act_dtype,
                     per_channel_gate),), dev, inner_contiguous=2)
    gate_shape, inner = ((slots, HV, L, K), 2) if per_channel_gate else ((slots, HV, L), 1)
    chk.check_tensor("layer.g_ring", layer.g_ring, gate_shape, (torch.float32,), dev, inner_contiguous=inner)
    chk.check_tensor("layer.cursor", layer.cursor, (slots,), (torch.int32,), dev)
    chk.check_tensor("layer.arrive", layer.arrive, (slots,), (torch.int32,), dev)
    chk.check_tensor("layer.coef", layer.coef, (slots, HV, delta_record_len(L, K, per_channel_gate)),
                     (torch.float32,), dev, inner_contiguous=2)
    chk.check_tensor("layer.step", layer.step, (slots + 1,), (torch.int32,), dev)
    if dev.type == "cuda":  # the persistent kernel moves state tiles by bulk copies, row inputs by 4-byte copies
        chk.check_aligned("state", layer.state, 16 // layer.state.element_size())
        chk.check_aligned("layer.u_ring", layer.u_ring, 4 // layer.u_ring.element_size())
        chk.check_aligned("layer.k_ring", layer.k_ring, K // 32)
        if per_channel_gate:
            chk.check_aligned("layer.g_ring", layer.g_ring, K // 32)


# ---------------------------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("replayssm::gdn_replay_decode",
                         mutates_args=("state", "u_ring", "k_ring", "g_ring", "cursor", "arrive", "coef", "step",
                                       "out"))
def _replay_decode_op(state: torch.Tensor, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
                      cursor: torch.Tensor, arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor,
                      q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                      a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float,
                      state_batch_indices: torch.Tensor, pad_slot_id: int, force_flush: bool,
                      out: torch.Tensor) -> None:
    ref.replay_step_(state, u_ring, k_ring, g_ring, cursor, q, k, v, a, b, A_log, dt_bias, scale,
                     state_batch_indices, pad_slot_id, force_flush, out)


@_replay_decode_op.register_kernel("cuda")
def _replay_decode_cuda(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, a, b, A_log, dt_bias,
                        scale, state_batch_indices, pad_slot_id, force_flush, out) -> None:
    if q.shape[0] == 0:
        return
    params = fill_params(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, a, b, A_log, dt_bias,
                         scale, None, state_batch_indices, pad_slot_id, force_flush, out)
    launch_delta("gdn", replay_kernels(force_flush, q.device), params, state, q, v)


@_replay_decode_op.register_fake
def _replay_decode_fake(*args, **kwargs) -> None:
    return None


@torch.library.custom_op("replayssm::gdn_state_update", mutates_args=("state", "out"))
def _state_update_op(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                     b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float,
                     state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor) -> None:
    ref.state_update_(state, q, k, v, a, b, A_log, dt_bias, scale, state_batch_indices, pad_slot_id, out)


@_state_update_op.register_kernel("cuda")
def _state_update_cuda(state, q, k, v, a, b, A_log, dt_bias, scale, state_batch_indices, pad_slot_id, out) -> None:
    if q.shape[0] == 0:
        return
    params = fill_params(state, None, None, None, None, None, None, None, q, k, v, a, b, A_log, dt_bias, scale, None,
                         state_batch_indices, pad_slot_id, False, out)
    launch_delta("gdn", ("delta_state_update_kernel",), params, state, q, v)


@_state_update_op.register_fake
def _state_update_fake(*args, **kwargs) -> None:
    return None


# ---------------------------------------------------------------------------------------------------- public API
def _validate_step(state, q, k, v, a, b, A_log, dt_bias, out, state_batch_indices, pad_slot_id):
    idx, out, dims = validate_common(state, q, k, v, out, state_batch_indices, pad_slot_id)
    _, _, HV, _, _ = dims
    dev, batch = state.device, q.shape[0]
    chk.check_tensor("a", a, (batch, HV), (q.dtype, torch.float32), dev, inner_contiguous=0)
    chk.check_tensor("b", b, (batch, HV), (q.dtype, torch.float32), dev, inner_contiguous=0)
    chk.check_tensor("A_log", A_log, (HV,), (torch.float32,), dev)
    chk.check_tensor("dt_bias", dt_bias, (HV,), (torch.float32,), dev)
    return idx, out, dims


def replay_decode(layer: GDNLayerCache, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                  b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None = None,  # noqa: N803
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, mode: str = "auto") -> torch.Tensor:
    """One ReplaySSM GDN decode step for a batch of rows at their own cursors; returns ``out`` [b, HV, V].

    ``layer``: a :class:`~trtllm_replayssm.core.cache.GDNLayerCache`. ``q, k`` [b,H,K], ``v`` [b,HV,V] (activation dtype),
    raw ``a, b`` [b,HV] (activation dtype or fp32), ``A_log, dt_bias`` [HV] fp32. ``mode``: ``auto`` (flush every
    step when the batch cannot fill the GPU), ``replay`` or ``flush``.
    """
    if not isinstance(layer, GDNLayerCache) or isinstance(layer, KDALayerCache):
        raise TypeError(f"layer: expected a GDNLayerCache, got {type(layer).__name__}")
    chk.check_mode(mode)
    idx, out, dims = _validate_step(layer.state, q, k, v, a, b, A_log, dt_bias, out, state_batch_indices, pad_slot_id)
    validate_rings(layer, dims, q.dtype, per_channel_gate=False, batch=q.shape[0])
    force = force_flush_for("gdn", mode, q.shape[0], dims[2], layer.state.dtype, layer.state.device)
    torch.ops.replayssm.gdn_replay_decode(layer.state, layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor,
                                          layer.arrive, layer.coef, layer.step, q, k, v, a, b, A_log, dt_bias,
                                          resolve_scale(scale, dims[4]), idx, pad_slot_id, force, out)
    return out


def state_update(state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                 b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None = None,  # noqa: N803
                 state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Baseline GDN step (read state, update, write state) on a slot pool ``state`` [slots,HV,V,K]; returns ``out``."""
    idx, out, dims = _validate_step(state, q, k, v, a, b, A_log, dt_bias, out, state_batch_indices, pad_slot_id)
    torch.ops.replayssm.gdn_state_update(state, q, k, v, a, b, A_log, dt_bias, resolve_scale(scale, dims[4]), idx,
                                         pad_slot_id, out)
    return out
