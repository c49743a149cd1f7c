"""Mamba-2 decode ops: ``torch.ops.replayssm.mamba2_replay_decode`` and ``torch.ops.replayssm.mamba2_state_update``.

The custom ops mutate their cache/output arguments in place and return nothing (CUDA-graph capturable, with fake
impls for torch.compile). CUDA tensors run the NVRTC-compiled kernels of ``plugins/mamba2_decode.cu`` on the current
stream; CPU tensors run the float32 reference (``reference/mamba2.py``), which is also the CPU fallback.
Callers use :func:`replay_decode` and :func:`state_update`, which validate arguments before any launch.
"""
from __future__ import annotations

import ctypes
import functools
from typing import Optional

import torch

from trtllm_replayssm.core.cache import Mamba2LayerCache
from trtllm_replayssm.core.jit.configs import NUM_WARPS, mamba2_config, tile_choices
from trtllm_replayssm.core.jit.loader import get_kernel, launch
from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core.ops.launch import (fitting_tiles, force_flush_for, launch_persistent, launch_prep, make_struct,
                                          persistent_ctas_per_sm, ptr, require_persistent_arch, rows_per_cta,
                                          sm_count, step_rows, stride)
from trtllm_replayssm.core.reference import mamba2 as ref

_P = ctypes.c_void_p
_I64 = ctypes.c_longlong
_I32 = ctypes.c_int
# Mirrors `struct Mamba2Params` in plugins/mamba2_decode.cu (same order; natural alignment).
_Mamba2Params = make_struct("Mamba2Params", [
    ("state", _P), ("x_ring", _P), ("dt_ring", _P), ("B_ring", _P), ("cursor", _P), ("arrive", _P),
    ("coef", _P), ("step", _P), ("x", _P), ("dt", _P), ("A", _P), ("B", _P), ("C", _P), ("D", _P), ("z", _P),
    ("dt_bias", _P),
    ("slot_idx", _P), ("out", _P),
    ("s_state_slot", _I64), ("s_state_head", _I64), ("s_xr_slot", _I64), ("s_xr_head", _I64),
    ("s_dtr_slot", _I64), ("s_dtr_head", _I64), ("s_Br_slot", _I64), ("s_Br_group", _I64), ("s_coef_row", _I64),
    ("s_x_b", _I64), ("s_x_h", _I64), ("s_dt_b", _I64), ("s_dt_h", _I64), ("s_B_b", _I64), ("s_B_g", _I64),
    ("s_C_b", _I64), ("s_C_g", _I64), ("s_z_b", _I64), ("s_z_h", _I64), ("s_out_b", _I64), ("s_out_h", _I64),
    ("nheads", _I32), ("ngroups", _I32), ("L", _I32), ("pad_slot_id", _I32),
    ("dt_softplus", _I32), ("dt_is_f32", _I32), ("force_flush", _I32), ("batch", _I32),
    ("stages", _I32), ("stage_bytes", _I32), ("fold_bytes", _I32), ("tail_start", _I32),
])

# Optional per-process override of the row tile (benchmark sweeps); None = heuristic.
ROWS_PER_CTA_OVERRIDE: Optional[int] = None
# Share of the replay main kernel's tiles claimed at run time (ops._launch.tail_start; None: all round-robin). H200,
# batch 256, against None: Nemotron-3-Nano-4B fp32 290.3 / 290.7 -> 0.05: 284.0 / 284.3 / 285.1 / 284.5 us, 0.1:
# 294.9 / 289.4 / 282.2 / 281.3; Nemotron-3-Super-120B fp32 306.4 / 306.6 -> 0.05: 305.8 / 305.5, 0.1: 301.2 / 300.1 /
# 301.3 / 300.5; Nano bf16 245.0 -> 0.05: 234.7, 0.1: 227.6 (benchmarks/results/dev/sweep-s11-5-*.log, sweep-s12-*.log).
TAIL_FRACTION: float | None = 0.1


def _fill_params(state, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z, dt_bias,
                 dt_softplus, idx, pad_slot_id, force_flush, out) -> ctypes.Structure:
    L = x_ring.shape[2] if x_ring is not None else 1
    return _Mamba2Params(
        ptr(state), ptr(x_ring), ptr(dt_ring), ptr(B_ring), ptr(cursor), ptr(arrive), ptr(coef), step_rows(step),
        ptr(x), ptr(dt), ptr(A), ptr(B), ptr(C), ptr(D), ptr(z), ptr(dt_bias), ptr(idx), ptr(out),
        state.stride(0), state.stride(1), stride(x_ring, 0), stride(x_ring, 1), stride(dt_ring, 0), stride(dt_ring, 1),
        stride(B_ring, 0), stride(B_ring, 1), stride(coef, 0),
        x.stride(0), x.stride(1), dt.stride(0), dt.stride(1), B.stride(0), B.stride(1), C.stride(0), C.stride(1),
        stride(z, 0), stride(z, 1), out.stride(0), out.stride(1),
        x.shape[1], B.shape[1], L, pad_slot_id, int(dt_softplus), int(dt.dtype == torch.float32), int(force_flush),
        x.shape[0], 0, 0, 0, 0)


def stage_bytes(L: int, rows: int, d_state: int, state_elem: int, act_elem: int) -> int:
    """Bytes of one shared-memory stage of the persistent replay kernel: the (rows x d_state) checkpoint tile,
    slot/step/D, coef[0..L], x and z of the rows, C, and L ring rows (mirrors plugins/mamba2_decode.cu:stage_layout)."""
    r16 = lambda v: (v + 15) // 16 * 16  # noqa: E731
    total = (rows * d_state * state_elem + 16 + r16((L + 1) * 4) + 2 * r16(rows * act_elem) + r16(d_state * act_elem)
             + r16(L * rows * act_elem))
    return (total + 127) // 128 * 128


def fold_bytes(L: int, d_state: int, act_elem: int) -> int:
    """Bytes of the persistent replay kernel's fold buffer: a flush tile's B rows, [L][d_state]."""
    return (L * d_state * act_elem + 15) // 16 * 16


def _replay_tile(head_dim: int, d_state: int, L: int, state: torch.Tensor, x: torch.Tensor, work: int) -> int:
    """Row tile of the replay: the largest tile up to the launch heuristic's whose stage fits twice per CTA."""
    tile = rows_per_cta(head_dim, d_state, work, x.device, ROWS_PER_CTA_OVERRIDE)
    if ROWS_PER_CTA_OVERRIDE is not None:
        return tile
    return _fitting_tile(head_dim, d_state, L, state.element_size(), x.element_size(), tile, persistent_ctas_per_sm())


@functools.lru_cache(maxsize=None)
def _fitting_tile(head_dim: int, d_state: int, L: int, state_elem: int, act_elem: int, tile: int,
                  ctas_per_sm: int) -> int:
    stage = {t: stage_bytes(L, t, d_state, state_elem, act_elem) for t in tile_choices(head_dim, d_state)}
    fits = fitting_tiles(stage, tile, act_elem, ctas_per_sm)
    return max(fits) if fits else tile


def _launch(kernel_names: tuple[str, ...], params: ctypes.Structure, state: torch.Tensor, x: torch.Tensor,
            ngroups: int) -> None:
    """Launch the named kernels of one module in order: ``*_prep_kernel`` on (batch, ngroups), the state kernels on
    (P / tile, H, batch); ``*_main_kernel`` persistent (a few CTAs per SM streaming (tile x N) state tiles and their
    inputs through shared memory) as a programmatic dependent launch of the prep kernel."""
    batch, nheads, head_dim = x.shape
    d_state = state.shape[-1]
    replay = any(name.endswith("_main_kernel") for name in kernel_names)
    tile = (_replay_tile(head_dim, d_state, params.L, state, x, batch * nheads) if replay
            else rows_per_cta(head_dim, d_state, batch * nheads, x.device, ROWS_PER_CTA_OVERRIDE))
    config = mamba2_config(head_dim, d_state, state.dtype, x.dtype, tile)
    for name in kernel_names:
        function = get_kernel(config, name, x.device)
        if name.endswith("_prep_kernel"):
            launch_prep(function, (batch, ngroups, 1),
                        (32 * _prep_warps(batch * ngroups, nheads // ngroups, x.device), 1, 1), params)
        elif name.endswith("_main_kernel"):
            params.stage_bytes = stage_bytes(params.L, tile, d_state, state.element_size(), x.element_size())
            launch_persistent(function, params, batch * nheads * (head_dim // tile), x.device,
                              fold_bytes(params.L, d_state, x.element_size()), TAIL_FRACTION)
        else:
            launch(function, (head_dim // tile, nheads, batch), (32 * NUM_WARPS, 1, 1), params)


def _prep_warps(ctas: int, heads_per_group: int, device: torch.device) -> int:
    """A warp per head (up to 16) when the prep grid is small; 4 warps looping over heads when it fills the GPU
    (measured on the H200: 16 warps win at batch 8, lose ~2% at batch 256)."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    if ctas <= 2 * sm_count(index):
        return min(16, max(NUM_WARPS, heads_per_group))
    return NUM_WARPS


# ---------------------------------------------------------------------------------------------------- custom ops
@torch.library.custom_op("replayssm::mamba2_replay_decode",
                         mutates_args=("state", "x_ring", "dt_ring", "B_ring", "cursor", "arrive", "coef", "step",
                                       "out"))
def _replay_decode_op(state: torch.Tensor, x_ring: torch.Tensor, dt_ring: torch.Tensor, B_ring: torch.Tensor,
                      cursor: torch.Tensor, arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor,
                      x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                      B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                      dt_bias: Optional[torch.Tensor], dt_softplus: bool, state_batch_indices: torch.Tensor,
                      pad_slot_id: int, force_flush: bool, out: torch.Tensor) -> None:
    # CPU: the float32 reference (coef/step are GPU-only scratch).
    ref.replay_step_(state, x_ring, dt_ring, B_ring, cursor, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                     state_batch_indices, pad_slot_id, force_flush, out)


@_replay_decode_op.register_kernel("cuda")
def _replay_decode_cuda(state, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z,
                        dt_bias, dt_softplus, state_batch_indices, pad_slot_id, force_flush, out) -> None:
    if x.shape[0] == 0:
        return
    params = _fill_params(state, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z,
                          dt_bias, dt_softplus, state_batch_indices, pad_slot_id, False, out)
    if not force_flush:
        require_persistent_arch(x.device, "mamba2_replay_decode")
    kernels = ("mamba2_flush_decode_kernel",) if force_flush else ("mamba2_replay_prep_kernel",
                                                                    "mamba2_replay_main_kernel")
    _launch(kernels, params, state, x, B.shape[1])


@_replay_decode_op.register_fake
def _replay_decode_fake(*args, **kwargs) -> None:
    return None


@torch.library.custom_op("replayssm::mamba2_state_update", mutates_args=("state", "out"))
def _state_update_op(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                     C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                     dt_bias: Optional[torch.Tensor], dt_softplus: bool, state_batch_indices: torch.Tensor,
                     pad_slot_id: int, out: torch.Tensor) -> None:
    ref.state_update_(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out)


@_state_update_op.register_kernel("cuda")
def _state_update_cuda(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                       out) -> None:
    if x.shape[0] == 0:
        return
    params = _fill_params(state, None, None, None, None, None, None, None, x, dt, A, B, C, D, z, dt_bias,
                          dt_softplus, state_batch_indices, pad_slot_id, False, out)
    _launch(("mamba2_state_update_kernel",), params, state, x, B.shape[1])


@_state_update_op.register_fake
def _state_update_fake(*args, **kwargs) -> None:
    return None


# ---------------------------------------------------------------------------------------------------- public API
def _validate_step(state: torch.Tensor, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices, pad_slot_id):
    chk.check_tensor("state", state, (None, None, None, None), chk.FLOAT_DTYPES, inner_contiguous=2)
    slots, H, P, N = state.shape
    dev = state.device
    if N % 32:
        raise ValueError(f"state: d_state (last dim) must be a multiple of 32, got {N}")
    if P % 4:
        raise ValueError(f"state: head_dim (dim 2) must be a multiple of 4, got {P}")
    chk.check_tensor("x", x, (None, H, P), chk.ACT_DTYPES, dev)
    batch = x.shape[0]
    chk.check_tensor("B", B, (batch, None, N), (x.dtype,), dev)
    G = B.shape[1]
    if G == 0 or H % G:
        raise ValueError(f"B: ngroups (dim 1) must divide nheads={H}, got {G}")
    chk.check_tensor("C", C, (batch, G, N), (x.dtype,), dev)
    chk.check_tensor("dt", dt, (batch, H), (x.dtype, torch.float32), dev, inner_contiguous=0)
    chk.check_tensor("A", A, (H,), (torch.float32,), dev)
    chk.check_optional("D", D, (H,), (torch.float32,), dev)
    chk.check_optional("dt_bias", dt_bias, (H,), (torch.float32,), dev)
    chk.check_optional("z", z, (batch, H, P), (x.dtype,), dev)
    if out is None:
        out = torch.empty_like(x)
    chk.check_tensor("out", out, (batch, H, P), (x.dtype,), dev)
    if dev.type == "cuda":
        epl = N // 32
        chk.check_aligned("state", state, epl)
        chk.check_aligned("B", B, epl)
        chk.check_aligned("C", C, epl)
    idx = chk.slot_indices("state_batch_indices", state_batch_indices, batch, slots, pad_slot_id, dev)
    return idx, out


def replay_decode(layer: Mamba2LayerCache, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                  C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                  dt_bias: torch.Tensor | None = None, dt_softplus: bool = True,
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, mode: str = "auto") -> torch.Tensor:
    """One ReplaySSM decode step for a batch of rows at their own cursors; returns ``out`` [b, H, P].

    ``layer``: a :class:`~trtllm_replayssm.core.cache.Mamba2LayerCache`. ``x`` [b,H,P], ``dt`` [b,H], ``A`` [H] fp32,
    ``B``/``C`` [b,G,N], ``D``/``dt_bias`` [H] fp32, ``z`` [b,H,P]. ``mode``: ``auto`` (flush every step when the
    batch cannot fill the GPU), ``replay`` or ``flush``.
    """
    if not isinstance(layer, Mamba2LayerCache):
        raise TypeError(f"layer: expected a Mamba2LayerCache, got {type(layer).__name__}")
    chk.check_mode(mode)
    idx, out = _validate_step(layer.state, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices, pad_slot_id)
    slots, H, P, N = layer.state.shape
    L = layer.buffer_len
    dev = layer.state.device
    chk.check_tensor("layer.x_ring", layer.x_ring, (slots, H, L, P), (x.dtype,), dev, inner_contiguous=2)
    chk.check_tensor("layer.dt_ring", layer.dt_ring, (slots, H, L), (torch.float32,), dev)
    chk.check_tensor("layer.B_ring", layer.B_ring, (slots, B.shape[1], L, N), (x.dtype,), dev, inner_contiguous=2)
    chk.check_tensor("layer.cursor", layer.cursor, (slots,), (torch.int32,), dev)
    chk.check_tensor("layer.arrive", layer.arrive, (slots,), (torch.int32,), dev)
    chk.check_tensor("layer.coef", layer.coef, (slots, H, L + 1), (torch.float32,), dev, inner_contiguous=2)
    chk.check_tensor("layer.step", layer.step, (slots + 1,), (torch.int32,), dev)
    chk.check_scratch_rows(x.shape[0], slots)
    if dev.type == "cuda":  # the persistent kernel moves state tiles by bulk copies, row inputs by 4-byte copies
        chk.check_aligned("state", layer.state, 16 // layer.state.element_size())
        for name, t in (("x", x), ("z", z), ("layer.x_ring", layer.x_ring)):
            if t is not None:
                chk.check_aligned(name, t, 4 // t.element_size())
    force = force_flush_for("mamba2", mode, x.shape[0], H, layer.state.dtype, dev)
    torch.ops.replayssm.mamba2_replay_decode(layer.state, layer.x_ring, layer.dt_ring, layer.B_ring, layer.cursor,
                                             layer.arrive, layer.coef, layer.step, x, dt, A, B, C, D, z,
                                             dt_bias, dt_softplus, idx, pad_slot_id, force, out)
    return out


def state_update(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                 dt_bias: torch.Tensor | None = None, dt_softplus: bool = True,
                 state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """Baseline single-token state update (read state, update, write state) on a slot pool; returns ``out``."""
    idx, out = _validate_step(state, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices, pad_slot_id)
    torch.ops.replayssm.mamba2_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, pad_slot_id, out)
    return out
