"""Mamba-2 speculative decoding ops: the replay verify (``torch.ops.replayssm.mamba2_verify_decode``) and the
per-draft-state baseline (``mamba2_per_draft_verify`` / ``mamba2_per_draft_commit``).

A verify decodes each row's window of T tokens (1 + drafts, T <= MAX_WINDOW) from the checkpoint and the row's
committed ring history, folding the history into the checkpoint first when the ring would overrun, and writes the
window's records past the history; ``spec.commit`` then keeps each row's accepted count (``core/spec_cursor.py``).
The per-draft baseline writes the state after every window token and copies the accepted one back, as vLLM and
upstream TensorRT-LLM do outside their replay paths. CUDA tensors run ``plugins/mamba2_decode.cu``; CPU tensors the
float32 references (``core/reference/mamba2.py``). Plain checkpoints (fp32, fp16, bf16 pools) only.
"""
from __future__ import annotations

from typing import Optional

import torch

from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core.cache import Mamba2LayerCache
from trtllm_replayssm.core.jit.configs import tile_choices
from trtllm_replayssm.core.jit.loader import get_kernel, launch
from trtllm_replayssm.core.layouts import (MAMBA2_PARAMS, VERIFY_WINDOW_BUCKETS, mamba2_fold_bytes,
                                           mamba2_verify_stage_bytes, verify_coef_floats)
from trtllm_replayssm.core.limits import NUM_WARPS
from trtllm_replayssm.core.ops.launch import STATE_BLOCK, define_op, ptr, run_plan
from trtllm_replayssm.core.ops.mamba2 import (DEFAULT_TUNING, SPEC_KERNELS, TAIL_FRACTION, _params, kernel_config,
                                              validate_rows)
from trtllm_replayssm.core.ops.spec import check_window
from trtllm_replayssm.core.plans import (Device, Launch, LaunchPlan, Tuning, adaptive_threshold, checked_plan,
                                         device_of, persistent_verify_plan, programmatic_prep, resolved_tail_fraction,
                                         state_l2_hints, state_tile)
from trtllm_replayssm.core.reference import mamba2 as ref


def rows_per_cta(state: torch.Tensor, batch: int, tuning: Tuning = DEFAULT_TUNING) -> int:
    """The row tile of the per-draft kernels for ``batch`` rows of the pool ``state`` [slots, H, P, N] (CPU: 0): the
    state kernels' heuristic."""
    _, H, P, N = state.shape
    dev = device_of(state.device)
    return state_tile(P, N, batch * H, dev, tuning) if dev.is_cuda else 0


# A grid verify thread's checkpoint rows load ahead when they and its C columns of a window of up to 4 tokens fit this
# many bytes (plugins/mamba2_decode.cu kVerifyRawBytes).
VERIFY_RAW_BYTES = 192
# Below this many (batch row, head) work items per SM the verify runs a CTA per row tile (grid), from it on the
# persistent kernel: H200, Super, T = 4, grid / persistent µs per step: batch 1 15.1 / 21.8, batch 8 35.8 / 54.9,
# batch 64 179.8 / 133.9 (docs/decisions.md, Mamba-2 verify).
VERIFY_PERSISTENT_MIN_WORK_PER_SM = 16
# The one-launch verify's row tile: the largest up to this many rows whose grid gives every SM
# ONE_LAUNCH_VERIFY_MIN_CTAS_PER_SM CTAs (every CTA computes its head's B·C products itself, so fewer, larger tiles
# pay): H100, T = 4, Super, µs per step (kernel times) with 8 / 16 / 32-row tiles: batch 1 11.7 / 8.3 / 9.4, batch 2
# 19.8 / 13.8 / 11.3, batch 4 35.8 / 24.7 / 19.5 (docs/decisions.md, Mamba-2 verify in one launch).
ONE_LAUNCH_VERIFY_MAX_ROWS = 32
ONE_LAUNCH_VERIFY_MIN_CTAS_PER_SM = 3


def _grid_tile(P: int, N: int, state_elem: int, batch: int, H: int, dev: Device, tuning: Tuning) -> int:
    """The grid verify's row tile: the state kernels' heuristic, capped where a thread's rows and C columns would not
    load ahead (VERIFY_RAW_BYTES)."""
    tile = state_tile(P, N, batch * H, dev, tuning)
    if tuning.rows_per_cta is not None:
        return tile
    c_bytes = 4 * (N // 32) * 4
    ahead = [t for t in tile_choices(P, N) if t <= tile and t // NUM_WARPS * N * state_elem // 32 + c_bytes
             <= VERIFY_RAW_BYTES]
    return max(ahead) if ahead else min(tile_choices(P, N))


# The persistent verify's default tuning: two CTAs per SM of two stages each (H200, Super, batch 256, T = 4: 64-row
# tiles at 2 CTAs x 2 stages beat 32-row tiles at 3 x 2 and 3 x 3; docs/decisions.md, Mamba-2 verify).
VERIFY_TUNING = Tuning(ctas_per_sm=2, stages=2)


def verify_plan(layer: Mamba2LayerCache, batch: int, window: int, tuning: Tuning = VERIFY_TUNING,
                device: Device | None = None) -> LaunchPlan:
    """The launch plan of :func:`verify_decode` for ``batch`` rows of ``layer`` and windows of ``window`` tokens: the
    verify prep kernel, then, from the tuning's ``adaptive_threshold`` work items (batch x heads; default
    VERIFY_PERSISTENT_MIN_WORK_PER_SM per SM), the persistent verify kernel of the smallest window bucket that holds
    ``window``, with the largest row tile up to the state kernels' heuristic whose stage fits twice per CTA beside the
    fold buffer; below it, the grid verify kernel of that bucket (mode ``grid``), up to the tuning's
    ``one_launch_verify_max_work_per_sm`` in its one-launch form (no prep kernel)."""
    _, H, P, N = layer.require_state().shape
    G, R = layer.B_ring.shape[1], layer.buffer_len
    dev = device or device_of(layer.state.device)
    key = verify_plan_key(layer, batch, window)
    if not dev.is_cuda:
        return LaunchPlan("replay", key, 0, (0, 0, 0))
    bucket = window_bucket(window)
    state_elem, act_elem = layer.state.element_size(), layer.x_ring.element_size()
    prep = dict(prep_grid=(batch, G, 1), prep_threads=32 * NUM_WARPS, programmatic_prep=programmatic_prep(tuning))
    if batch * H < adaptive_threshold(VERIFY_PERSISTENT_MIN_WORK_PER_SM, dev, tuning):
        if batch * H <= tuning.one_launch_verify_max_work_per_sm * dev.sm_count:  # a programmatic state kernel
            tile = state_tile(P, N, batch * H, dev, tuning, ONE_LAUNCH_VERIFY_MAX_ROWS,
                              ONE_LAUNCH_VERIFY_MIN_CTAS_PER_SM)
            grid = (P // tile, H, batch)
            return LaunchPlan("grid", key, tile, grid, programmatic=tuning.programmatic_state,
                              l2_hints=state_l2_hints(grid, dev, tuning))
        tile = _grid_tile(P, N, state_elem, batch, H, dev, tuning)
        return LaunchPlan("grid", key, tile, (P // tile, H, batch), **prep)
    stage = {t: mamba2_verify_stage_bytes(R, t, N, state_elem, act_elem, bucket) for t in tile_choices(P, N)}
    return persistent_verify_plan(key, stage, state_tile(P, N, batch * H, dev, tuning), batch * H * P, act_elem,
                                  mamba2_fold_bytes(R, N, act_elem), resolved_tail_fraction(tuning, TAIL_FRACTION),
                                  dev, tuning, **prep)


def verify_plan_key(layer: Mamba2LayerCache, batch: int, window: int) -> tuple:
    """What a verify plan depends on: batch, window, shapes, ring length and dtypes."""
    return ("mamba2 verify", batch, window, *layer.require_state().shape[1:], layer.B_ring.shape[1], layer.buffer_len,
            layer.state.dtype, layer.x_ring.dtype)


def window_bucket(window: int) -> int:
    """The verify kernel's compile-time window bound for windows of ``window`` tokens."""
    return next(k for k in VERIFY_WINDOW_BUCKETS if window <= k)


def _run(kernel: str, state: torch.Tensor, act_dtype: torch.dtype, grid: tuple[int, int, int], tile: int,
         params) -> None:
    _, H, P, N = state.shape
    config = kernel_config(P, N, state.dtype, act_dtype, tile)
    launch(get_kernel(config, SPEC_KERNELS[kernel], state.device), grid, STATE_BLOCK, params)


# ---------------------------------------------------------------------------------------------------- custom ops
def _verify_cpu(state: torch.Tensor, x_ring: torch.Tensor, dt_ring: torch.Tensor, B_ring: torch.Tensor,
                cursor: torch.Tensor, arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor, x: torch.Tensor,
                dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor],
                z: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor], dt_softplus: bool,
                state_batch_indices: torch.Tensor, pad_slot_id: int, plan: list[int], out: torch.Tensor) -> None:
    # The float32 reference (coef/step are GPU-only scratch).
    ref.verify_step_(state, x_ring, dt_ring, B_ring, cursor, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                     state_batch_indices, pad_slot_id, out)


def _verify_cuda(state, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z, dt_bias,
                 dt_softplus, state_batch_indices, pad_slot_id, plan, out) -> None:
    if x.shape[0] == 0:
        return
    params = _params(state, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z, dt_bias,
                     dt_softplus, state_batch_indices, pad_slot_id, out)
    launch_plan = Launch.from_words(plan)
    config = kernel_config(x.shape[-1], B.shape[-1], state.dtype, x.dtype, launch_plan.rows_per_cta)
    bucket = window_bucket(x.shape[1])
    grid = f"verify_grid_t{bucket}" if launch_plan.prep_threads else f"verify_one_launch_t{bucket}"
    names = {"prep": SPEC_KERNELS["verify_prep"], "main": SPEC_KERNELS[f"verify_main_t{bucket}"],
             "grid": SPEC_KERNELS[grid]}
    run_plan(config, names, launch_plan, params, x.device, prep_carveout=False)


_verify_op = define_op("mamba2_verify_decode",
                       ("state", "x_ring", "dt_ring", "B_ring", "cursor", "arrive", "coef", "step", "out"),
                       _verify_cpu, _verify_cuda)


def _per_draft_cpu(state: torch.Tensor, inter: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                   B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                   dt_bias: Optional[torch.Tensor], dt_softplus: bool, state_batch_indices: torch.Tensor,
                   pad_slot_id: int, rows_per_cta: int, out: torch.Tensor) -> None:
    ref.per_draft_verify_(state, inter, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices,
                          pad_slot_id, out)


def _per_draft_cuda(state, inter, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id,
                    rows_per_cta, out) -> None:
    if x.shape[0] == 0:
        return
    params = _params(state, None, None, None, None, None, None, None, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                     state_batch_indices, pad_slot_id, out, inter=inter)
    _run("per_draft", state, x.dtype, (x.shape[-1] // rows_per_cta, x.shape[-2], x.shape[0]), rows_per_cta, params)


_per_draft_op = define_op("mamba2_per_draft_verify", ("inter", "out"), _per_draft_cpu, _per_draft_cuda)


def _per_draft_commit_cpu(state: torch.Tensor, inter: torch.Tensor, accepted: torch.Tensor,
                          state_batch_indices: torch.Tensor, pad_slot_id: int, rows_per_cta: int) -> None:
    ref.per_draft_commit_(state, inter, accepted, state_batch_indices, pad_slot_id)


def _per_draft_commit_cuda(state, inter, accepted, state_batch_indices, pad_slot_id, rows_per_cta) -> None:
    batch, T = inter.shape[:2]
    if batch == 0:
        return
    params = MAMBA2_PARAMS.pack(**{**dict.fromkeys(MAMBA2_PARAMS.field_names, 0),
        "state": ptr(state), "inter": ptr(inter), "accepted": ptr(accepted), "slot_idx": ptr(state_batch_indices),
        "s_state_slot": state.stride(0), "s_state_head": state.stride(1), "s_inter_b": inter.stride(0),
        "s_inter_t": inter.stride(1), "nheads": state.shape[1], "pad_slot_id": pad_slot_id, "slots": state.shape[0],
        "window": T, "batch": batch})
    # The copy reads no activation: the module of a shipped (state, activation) pair.
    act = state.dtype if state.element_size() == 2 else torch.bfloat16
    _run("per_draft_commit", state, act, (state.shape[2] // rows_per_cta, state.shape[1], batch), rows_per_cta,
         params)


_per_draft_commit_op = define_op("mamba2_per_draft_commit", ("state",), _per_draft_commit_cpu,
                                 _per_draft_commit_cuda)


# ---------------------------------------------------------------------------------------------------- public API
def _validate_window(state: torch.Tensor, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices, pad_slot_id,
                     ring_len: int | None):
    """A window's checks (``mamba2.validate_rows``) against a plain pool ``state`` and, given, the ring length."""
    chk.check_tensor("state", state, (None, None, None, None), (torch.float32, torch.float16, torch.bfloat16))
    idx, out = validate_rows(state, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices, pad_slot_id, window=True)
    check_window(x.shape[1], ring_len if ring_len is not None else 2 * x.shape[1])
    return idx, out


def verify_decode(layer: Mamba2LayerCache, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                  C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                  dt_bias: torch.Tensor | None = None, dt_softplus: bool = True,
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, tuning: Tuning = VERIFY_TUNING,
                  plan: LaunchPlan | None = None) -> torch.Tensor:
    """Verify a window of T tokens per row from checkpoint + ring; returns ``out`` [b, T, H, P] (token t's output
    sees the window's tokens before it). ``x`` [b,T,H,P], ``dt`` [b,T,H], ``B``/``C`` [b,T,G,N], ``z`` [b,T,H,P],
    ``A``/``D``/``dt_bias`` [H] fp32. Follow it with ``spec.commit(layer, accepted, ..., window=T)``. The layer's
    rings hold at least 2T records; plain checkpoints only. ``plan``: what to launch (default
    ``verify_plan(layer, batch, T, tuning)``)."""
    if not isinstance(layer, Mamba2LayerCache):
        raise TypeError(f"layer: expected a Mamba2LayerCache, got {type(layer).__name__}")
    if layer.storage is not None:
        raise NotImplementedError(f"state: speculative verify reads plain checkpoints (fp32, fp16, bf16), the layer "
                                  f"stores {layer.spec.label}")
    state = layer.require_state()
    idx, out = _validate_window(state, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices, pad_slot_id,
                                layer.buffer_len)
    slots, H, P, N = state.shape
    R, dev = layer.buffer_len, state.device
    chk.check_tensor("layer.x_ring", layer.x_ring, (slots, H, R, P), (x.dtype,), dev, inner_contiguous=2)
    chk.check_tensor("layer.dt_ring", layer.dt_ring, (slots, H, R), (torch.float32,), dev)
    chk.check_tensor("layer.B_ring", layer.B_ring, (slots, B.shape[2], R, N), (x.dtype,), dev, inner_contiguous=2)
    chk.check_tensor("layer.step", layer.step, (slots + 1,), (torch.int32,), dev)
    chk.check_scratch_rows(x.shape[0], slots)
    if dev.type == "cuda":  # state tiles by bulk copies, row inputs by 16-byte chunks where aligned, else 4-byte words
        chk.check_aligned("state", state, 16 // state.element_size())
        for name, t in (("x", x), ("z", z), ("layer.x_ring", layer.x_ring)):
            if t is not None:
                chk.check_aligned(name, t, 4 // t.element_size())
    if plan is None:
        plan = verify_plan(layer, x.shape[0], x.shape[1], tuning)
    else:
        checked_plan(plan, verify_plan_key(layer, x.shape[0], x.shape[1]))
    coef = torch.empty(x.shape[0], H, verify_coef_floats(R), dtype=torch.float32, device=dev)
    _verify_op(state, layer.x_ring, layer.dt_ring, layer.B_ring, layer.cursor, layer.arrive, coef, layer.step, x, dt,
               A, B, C, D, z, dt_bias, dt_softplus, idx, pad_slot_id, plan.words, out)
    return out


def per_draft_verify(state: torch.Tensor, inter: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                     B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                     dt_bias: torch.Tensor | None = None, dt_softplus: bool = True,
                     state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                     out: torch.Tensor | None = None, tuning: Tuning = DEFAULT_TUNING) -> torch.Tensor:
    """The per-draft-state verify (baseline): T recurrence steps from each row's slot of the pool ``state``
    [slots,H,P,N], the state after window token t into ``inter[b, t]`` ([b,T,H,P,N], the pool's dtype); returns
    ``out`` [b,T,H,P]. Window inputs as :func:`verify_decode`; the pool is written by :func:`per_draft_commit`."""
    idx, out = _validate_window(state, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices, pad_slot_id, None)
    chk.check_tensor("inter", inter, (x.shape[0], x.shape[1], *state.shape[1:]), (state.dtype,), state.device,
                     inner_contiguous=3, dtype_of="state")
    _per_draft_op(state, inter, x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, pad_slot_id,
                  rows_per_cta(state, x.shape[0], tuning), out)
    return out


def per_draft_commit(state: torch.Tensor, inter: torch.Tensor, accepted: torch.Tensor,
                     state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                     tuning: Tuning = DEFAULT_TUNING) -> None:
    """After :func:`per_draft_verify`: each row's slot state <- ``inter[b, accepted[b] - 1]`` (``accepted`` [b]
    int32, 1..T). On CUDA a row with a count outside 1..T copies nothing (the CPU reference raises)."""
    chk.check_tensor("state", state, (None, None, None, None), (torch.float32, torch.float16, torch.bfloat16))
    chk.check_tensor("inter", inter, (None, None, *state.shape[1:]), (state.dtype,), state.device,
                     inner_contiguous=3, dtype_of="state")
    batch = inter.shape[0]
    chk.check_tensor("accepted", accepted, (batch,), (torch.int32,), state.device)
    idx = chk.slot_indices("state_batch_indices", state_batch_indices, batch, state.shape[0], pad_slot_id,
                           state.device)
    _per_draft_commit_op(state, inter, accepted, idx, pad_slot_id, rows_per_cta(state, batch, tuning))
