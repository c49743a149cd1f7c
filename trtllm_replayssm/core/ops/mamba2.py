"""Mamba-2 decode ops: ``torch.ops.replayssm.mamba2_replay_decode`` and ``torch.ops.replayssm.mamba2_state_update``.

The custom ops mutate their cache/output arguments in place and return nothing (CUDA-graph capturable, with fake
impls for torch.compile). CUDA tensors run the NVRTC-compiled kernels of ``plugins/mamba2_decode.cu`` on the current
stream with the launch plan they are given; CPU tensors run the float32 reference (``core/reference/mamba2.py``),
which is also the CPU fallback. Callers use :func:`replay_decode` and :func:`state_update`, which validate arguments
before any launch and plan with :func:`replay_plan` / :func:`state_update_plan` unless given a plan.
"""
from __future__ import annotations

import functools
from dataclasses import replace
from typing import Optional

import torch

from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core import crossovers
from trtllm_replayssm.core.cache import Mamba2LayerCache
from trtllm_replayssm.core.checkpoint import OP_TENSORS, Checkpoint, spec_of_op_args, spec_op_args
from trtllm_replayssm.core.dims import Mamba2Dims
from trtllm_replayssm.core.formats import StateSpec, get_dtype, state_spec
from trtllm_replayssm.core.jit.configs import KernelConfig, tile_choices, unique
from trtllm_replayssm.core.layouts import (MAMBA2_PARAMS, VERIFY_WINDOW_BUCKETS, mamba2_fold_bytes,
                                           mamba2_size_checks, mamba2_stage_bytes, mamba2_stream_records_bytes,
                                           stored_state_params)
from trtllm_replayssm.core.limits import NUM_WARPS
from trtllm_replayssm.core.ops import conv
from trtllm_replayssm.core.ops import spec as spec_ops
from trtllm_replayssm.core.ops.launch import define_op, ptr, run_plan, step_rows, stored_fields, stride
from trtllm_replayssm.core.plans import (DECODE_MIN_CTAS_PER_SM, FUSED_MAX_ROWS_PER_CTA, FUSED_STREAM_STAGES,
                                         PLAIN_REPLAY_CTAS, SHARED_BYTES_PER_SM, Device, Launch, LaunchPlan, Tuning,
                                         checked_plan, device_of, fitting_tiles, flush_ctas, flush_rows_apart,
                                         non_replay_plan, persistent_plan, programmatic_prep, replay_tuning,
                                         resolved_tail_fraction, state_l2_hints, state_tile)
from trtllm_replayssm.core.reference import mamba2 as ref

KERNELS = {"state": "mamba2_state_update_kernel", "flush": "mamba2_flush_decode_kernel",
           "fused": "mamba2_fused_decode_kernel", "fused_stream": "mamba2_fused_stream_kernel",
           "prep": "mamba2_replay_prep_kernel", "main": "mamba2_replay_main_kernel",
           "flush_rows": "mamba2_replay_flush_kernel"}
SPEC_KERNELS = {"verify_prep": "mamba2_verify_prep_kernel",
                **{f"verify_main_t{t}": f"mamba2_verify_main_t{t}_kernel" for t in VERIFY_WINDOW_BUCKETS},
                **{f"verify_grid_t{t}": f"mamba2_verify_grid_t{t}_kernel" for t in VERIFY_WINDOW_BUCKETS},
                **{f"verify_one_launch_t{t}": f"mamba2_verify_one_launch_t{t}_kernel" for t in VERIFY_WINDOW_BUCKETS},
                "per_draft": "mamba2_per_draft_verify_kernel", "per_draft_commit": "mamba2_per_draft_commit_kernel"}
REPLAY_STATE_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # replay measured faster than the baseline
# Share of the replay main kernel's tiles claimed at run time (docs/decisions.md, tail claims).
TAIL_FRACTION = 0.1
# The replay main kernel on a stored checkpoint: at most STORED_REPLAY_CTAS CTAs per SM (kReplayCtasPerSm: it never
# folds, 64-72 registers), by default STORED_DEFAULT_CTAS, STORED_TWO_HEAD_CTAS with tiles of two heads (H200, batch
# 256, whole cycles: docs/decisions.md, a stored checkpoint's main kernel never folds).
STORED_REPLAY_CTAS = 5
STORED_DEFAULT_CTAS = 4
STORED_TWO_HEAD_CTAS = 3
# Dynamic shared memory of the streaming one-launch replay: an SM's shared memory less the 1 KiB reserved per CTA and
# the kernel's static shared memory (at most 40 KiB: fp32 activations, head_dim 80).
MAX_STREAM_SHARED_BYTES = SHARED_BYTES_PER_SM - 1024 - 40 * 1024
DEFAULT_TUNING = Tuning()


# ---------------------------------------------------------------------------------------------------- kernels
def kernel_config(head_dim: int, d_state: int, state_dtype: torch.dtype | StateSpec, act_dtype: torch.dtype,
                  rows_per_cta: int) -> KernelConfig:
    """The Mamba-2 decode module (baseline, flush and replay kernels) for one shape, checkpoint spec (a plain state
    dtype or a StateSpec), activation dtype and row tile."""
    spec = state_spec(state_dtype, arg="state_dtype")
    # A tile of more rows than a head has spans heads: the persistent replay kernels only (plugins/mamba2_decode.cu);
    # the speculative kernels take plain checkpoints.
    # The streaming one-launch replay: whole-head modules of plain checkpoints.
    names = [k for k in KERNELS if k != "fused_stream" or (rows_per_cta == head_dim and not spec.stored)]
    kernels = tuple(KERNELS[k] for k in (("prep", "main", "flush_rows") if rows_per_cta > head_dim else names))
    if rows_per_cta <= head_dim and not spec.stored:
        kernels += tuple(SPEC_KERNELS.values())
    return KernelConfig(
        family="mamba2", source="mamba2_decode.cu", kernels=kernels,
        params=(("p", head_dim), ("n", d_state), ("pt", rows_per_cta), *stored_state_params(spec),
                ("act_t", get_dtype(act_dtype).cuda)),
        layouts=(MAMBA2_PARAMS,), checks=functools.partial(_checks, spec.read_format.row_bytes(d_state),
                                                             get_dtype(act_dtype).bytes, spec.stored))


def _checks(state_row_bytes: int, act_elem: int, stored: bool, config: KernelConfig) -> str:
    ctas = STORED_REPLAY_CTAS if stored else PLAIN_REPLAY_CTAS
    return "\n".join((mamba2_size_checks(config.param("pt"), config.param("n"), state_row_bytes, act_elem,
                                         config.param("p")),
                      f'static_assert(kReplayCtasPerSm == {ctas}, "kReplayCtasPerSm differs from core/ops/mamba2.py '
                      f'STORED_REPLAY_CTAS or core/plans.py PLAIN_REPLAY_CTAS");'))


def kernel_configs(dims: Mamba2Dims, state_dtype: torch.dtype | StateSpec,
                   act_dtype: torch.dtype) -> list[KernelConfig]:
    """Every module a layer of ``dims`` can launch at any batch size (all row tiles; with a plain checkpoint, the
    speculative commit's), and the conv1d decode step the TensorRT-LLM module runs right before its decode op."""
    tiles = tile_choices(dims.head_dim, dims.d_state)
    if two_head_shape(dims.head_dim, dims.nheads, dims.n_groups):
        tiles = [*tiles, 2 * dims.head_dim]
    speculative = [] if state_spec(state_dtype, arg="state_dtype").stored else [spec_ops.KERNEL_CONFIG]
    return unique([*(kernel_config(dims.head_dim, dims.d_state, state_dtype, act_dtype, t) for t in tiles),
                   *speculative, conv.conv_config(act_dtype)])


def two_head_shape(head_dim: int, nheads: int, ngroups: int) -> bool:
    """Whether the replay's persistent kernel can take tiles of two adjacent heads (2 x head_dim rows): a warp's
    quarter of them lies in one head and fits its lanes, and head pairs share a group."""
    return 2 * head_dim <= 32 * NUM_WARPS and nheads % 2 == 0 and (nheads // ngroups) % 2 == 0


# ---------------------------------------------------------------------------------------------------- planning
def replay_plan(layer: Mamba2LayerCache, batch: int, mode: str = "auto", tuning: Tuning = DEFAULT_TUNING,
                device: Device | None = None) -> LaunchPlan:
    """The launch plan of :func:`replay_decode` for ``batch`` rows of ``layer`` (``device``: the layer's GPU)."""
    slots, H, P = layer.require_state().shape[:3]
    G, L, N = layer.B_ring.shape[1], layer.buffer_len, layer.B_ring.shape[-1]
    dev = device or device_of(layer.state.device)
    key = replay_plan_key(layer, batch)
    replay_state = layer.storage is not None or layer.state.dtype in REPLAY_STATE_DTYPES
    other = non_replay_plan("mamba2_replay_decode", mode, key, batch * H, replay_state,
                            crossovers.entry("mamba2", layer.spec.label, dev.arch,
                                             launch=crossovers.launch_of(tuning.programmatic_state)),
                            dev, tuning,
                            lambda: _state_kernel_plan("flush", key, P, N, H, batch, dev, tuning),
                            lambda: _fused_plan(layer, key, batch, dev, tuning))
    if other is not None:
        return other
    tuning = replay_tuning(layer.spec, tuning, STORED_DEFAULT_CTAS, STORED_REPLAY_CTAS)
    row_bytes, act_elem = layer.spec.read_format.row_bytes(N), layer.x_ring.element_size()
    two_heads_ok = _two_head_tiles(layer)
    if tuning.rows_per_cta == 2 * P:
        if not two_heads_ok:
            raise ValueError(f"rows_per_cta: {2 * P} (two heads per tile) needs an even number of heads per group, "
                             f"head_dim <= 64 and the heads of a slot contiguous in the state")
        tile = 2 * P
    else:
        tile = state_tile(P, N, batch * H, dev, tuning)
        if tuning.rows_per_cta is None:  # two heads by default where non-flush steps read FP8 or NVFP4 (small tiles)
            tile = _fitting_tile(P, N, L, row_bytes, act_elem, tile, tuning.ctas_per_sm,
                                 two_heads_ok and layer.spec.read_format.quantized)
    if tile > P and layer.spec.stored and tuning.stored_ctas_per_sm is None:
        tuning = replace(tuning, ctas_per_sm=min(tuning.ctas_per_sm, STORED_TWO_HEAD_CTAS))
    num_tiles = batch * H * P // tile
    apart = flush_rows_apart(tuning, layer.spec.stored)
    fraction = resolved_tail_fraction(tuning, TAIL_FRACTION)
    # Tiles of two heads keep the fold buffer at the cost of a stage (H200, Super, batch 256, NVFP4 cycles: 302.0 ->
    # 278.0 µs; docs/decisions.md, the persistent producer bounds small tiles).
    main = persistent_plan(mamba2_stage_bytes(L, tile, N, row_bytes, act_elem, P), num_tiles,
                           0 if apart else mamba2_fold_bytes(L, N, act_elem), tile > P, fraction, dev, tuning)
    return LaunchPlan("replay", key, tile, (main.grid, 1, 1), main.stages, main.stage_bytes, main.fold_bytes,
                      main.tail_start, prep_grid=(batch, G, 1), prep_threads=32 * _prep_warps(batch * G, H // G, dev),
                      programmatic_prep=programmatic_prep(tuning), tail_fraction=fraction, num_tiles=num_tiles,
                      flush_ctas=flush_ctas(batch * H, apart, dev, tuning))


def replay_plan_key(layer: Mamba2LayerCache, batch: int) -> tuple:
    """What a replay plan depends on: batch, shapes, ring length, checkpoint spec and dtypes."""
    return ("mamba2 replay", batch, *layer.require_state().shape[1:3], layer.B_ring.shape[-1], layer.B_ring.shape[1],
            layer.buffer_len, layer.spec.label, layer.x_ring.dtype)


def state_update_plan_key(state: torch.Tensor | Checkpoint, batch: int, act_dtype: torch.dtype) -> tuple:
    spec = state.spec.label if isinstance(state, Checkpoint) else state.dtype
    return ("mamba2 state update", batch, *state.shape[1:], spec, act_dtype)


def state_update_plan(state: torch.Tensor | Checkpoint, batch: int, act_dtype: torch.dtype, tuning: Tuning = DEFAULT_TUNING,
                      device: Device | None = None) -> LaunchPlan:
    """The launch plan of :func:`state_update` for ``batch`` rows of the pool ``state`` [slots, H, P, N]."""
    _, H, P, N = state.shape
    dev = device or device_of(state.device)
    key = state_update_plan_key(state, batch, act_dtype)
    if not dev.is_cuda:
        return LaunchPlan("baseline", key, 0, (0, 0, 0))
    return _state_kernel_plan("baseline", key, P, N, H, batch, dev, tuning)


def _state_kernel_plan(mode: str, key: tuple, P: int, N: int, H: int, batch: int, dev: Device,
                       tuning: Tuning) -> LaunchPlan:
    tile = state_tile(P, N, batch * H, dev, tuning, FUSED_MAX_ROWS_PER_CTA if mode == "fused" else None,
                      DECODE_MIN_CTAS_PER_SM)
    grid = (P // tile, H, batch)
    return LaunchPlan(mode, key, tile, grid, programmatic=tuning.programmatic_state,
                      l2_hints=state_l2_hints(grid, dev, tuning))


def _fused_plan(layer: Mamba2LayerCache, key: tuple, batch: int, dev: Device, tuning: Tuning) -> LaunchPlan:
    """The one-launch replay: a CTA per row tile, or with ``tuning.fused_heads_per_cta`` = k the streaming form (a CTA
    per k consecutive heads of a group, their checkpoints through shared-memory stages)."""
    state = layer.require_state()
    _, H, P, N = state.shape
    k = tuning.fused_heads_per_cta
    if k is None:
        return _state_kernel_plan("fused", key, P, N, H, batch, dev, tuning)
    G, L = layer.B_ring.shape[1], layer.buffer_len
    if not dev.replay_capable:
        raise ValueError(f"fused_heads_per_cta: the streaming one-launch replay needs sm_90 or later (bulk copies), "
                         f"got {dev.arch}")
    if layer.storage is not None:
        raise ValueError(f"fused_heads_per_cta: the streaming one-launch replay takes plain checkpoints, got "
                         f"{layer.spec.label}")
    if (H // G) % k:
        raise ValueError(f"fused_heads_per_cta: expected a divisor of the {H // G} heads per group, got {k}")
    if state.stride(2) != N:
        raise ValueError(f"state: the streaming one-launch replay copies whole heads, each [P, N] contiguous; got "
                         f"strides {tuple(state.stride())}")
    stages = min(tuning.stages or FUSED_STREAM_STAGES, k)
    tile_bytes = P * N * state.element_size()
    records = mamba2_stream_records_bytes(L, k, P, layer.x_ring.element_size())
    if stages * tile_bytes + records > MAX_STREAM_SHARED_BYTES:
        raise ValueError(f"fused_heads_per_cta: {stages} stages of {tile_bytes} bytes and the records of {k} heads "
                         f"({records} bytes) exceed {MAX_STREAM_SHARED_BYTES} bytes of shared memory")
    grid = (H // k, 1, batch)
    return LaunchPlan("fused", key, P, grid, stages=stages, stage_bytes=tile_bytes, fold_bytes=records,
                      programmatic=tuning.programmatic_state, l2_hints=state_l2_hints(grid, dev, tuning))


@functools.lru_cache(maxsize=None)
def _fitting_tile(head_dim: int, d_state: int, L: int, state_row_bytes: int, act_elem: int, tile: int,
                  ctas_per_sm: int, two_heads: bool) -> int:
    """The largest row tile up to the heuristic's whose stage fits twice per CTA of the persistent kernel; where the
    heuristic takes whole heads and ``two_heads`` allows, a tile of two heads if its stage fits twice (the producer
    warp's per-tile work bounds small tiles: docs/decisions.md)."""
    choices = tile_choices(head_dim, d_state)
    if two_heads and tile == head_dim:
        choices, tile = [*choices, 2 * head_dim], 2 * head_dim
    stage = {t: mamba2_stage_bytes(L, t, d_state, state_row_bytes, act_elem, head_dim) for t in choices}
    fits = fitting_tiles(stage, tile, act_elem, ctas_per_sm)
    return max(fits) if fits else tile


def _two_head_tiles(layer: Mamba2LayerCache) -> bool:
    """Whether ``layer``'s replay can run tiles of two heads: the shape allows it and one bulk copy of a slot's two
    heads' state rows is contiguous (plain states: head stride P x N; stored checkpoints are dense)."""
    state = layer.require_state()
    _, H, P, N = state.shape
    if not two_head_shape(P, H, layer.B_ring.shape[1]):
        return False
    return layer.storage is not None or (state.stride(1) == P * N and state.stride(2) == N)


def _prep_warps(ctas: int, heads_per_group: int, dev: Device) -> int:
    """A warp per head (up to 16) when the prep grid is small; 4 warps looping over heads when it fills the GPU
    (H200: 16 warps win at batch 8, lose ~2% at batch 256)."""
    if ctas <= 2 * dev.sm_count:
        return min(16, max(NUM_WARPS, heads_per_group))
    return NUM_WARPS


# ---------------------------------------------------------------------------------------------------- custom ops
def _params(state, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
            idx, pad_slot_id, out, stored: dict[str, int] | None = None, inter: torch.Tensor | None = None,
            accepted: torch.Tensor | None = None):
    """The kernels' parameter struct. Row inputs are [b, H, P] / [b, H] / [b, G, N], or a verify window's
    [b, T, H, P] / [b, T, H] / [b, T, G, N] (``window`` T and the token strides set from x's rank)."""
    windowed = x.dim() == 4

    def tok(t: torch.Tensor | None) -> int:  # a window's token stride
        return stride(t, 1) if windowed else 0

    return MAMBA2_PARAMS.pack(**(stored or stored_fields()),
        state=ptr(state), x_ring=ptr(x_ring), dt_ring=ptr(dt_ring), B_ring=ptr(B_ring), cursor=ptr(cursor),
        arrive=ptr(arrive), coef=ptr(coef), step=step_rows(step), x=ptr(x), dt=ptr(dt), A=ptr(A), B=ptr(B),
        C=ptr(C), D=ptr(D), z=ptr(z), dt_bias=ptr(dt_bias), slot_idx=ptr(idx), out=ptr(out), inter=ptr(inter),
        accepted=ptr(accepted), s_state_slot=state.stride(0), s_state_head=state.stride(1),
        s_xr_slot=stride(x_ring, 0), s_xr_head=stride(x_ring, 1), s_dtr_slot=stride(dt_ring, 0),
        s_dtr_head=stride(dt_ring, 1), s_Br_slot=stride(B_ring, 0), s_Br_group=stride(B_ring, 1),
        s_coef_row=stride(coef, 0),
        s_x_b=x.stride(0), s_x_h=x.stride(-2), s_dt_b=dt.stride(0), s_dt_h=dt.stride(-1), s_B_b=B.stride(0),
        s_B_g=B.stride(-2), s_C_b=C.stride(0), s_C_g=C.stride(-2), s_z_b=stride(z, 0), s_z_h=stride(z, -2), s_out_b=out.stride(0), s_out_h=out.stride(-2),
        s_x_t=tok(x), s_dt_t=tok(dt), s_B_t=tok(B), s_C_t=tok(C), s_z_t=tok(z), s_out_t=tok(out),
        s_inter_b=stride(inter, 0), s_inter_t=stride(inter, 1),
        nheads=x.shape[-2], ngroups=B.shape[-2], L=x_ring.shape[2] if x_ring is not None else 1,
        pad_slot_id=pad_slot_id, slots=state.shape[0], dt_softplus=int(dt_softplus),
        dt_is_f32=int(dt.dtype == torch.float32), window=x.shape[1] if windowed else 1,
        force_flush=0, batch=x.shape[0], stages=0, stage_bytes=0, fold_bytes=0, tail_start=0,
        flush_apart=0, l2_hints=0)


def _launch(spec: torch.dtype | StateSpec, plan: list[int], params, x: torch.Tensor, d_state: int) -> None:
    """Run ``plan``'s kernels from the module of ``spec`` (a plain state dtype or a StateSpec)."""
    launch = Launch.from_words(plan)
    config = kernel_config(x.shape[2], d_state, spec, x.dtype, launch.rows_per_cta)
    run_plan(config, KERNELS, launch, params, x.device, prep_carveout=False)


def _replay_cpu(state: torch.Tensor, x_ring: torch.Tensor, dt_ring: torch.Tensor, B_ring: torch.Tensor,
                cursor: torch.Tensor, arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor, x: torch.Tensor,
                dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor],
                z: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor], dt_softplus: bool,
                state_batch_indices: torch.Tensor, pad_slot_id: int, plan: list[int], out: torch.Tensor) -> None:
    # The float32 reference (coef/step are GPU-only scratch).
    ref.replay_step_(state, x_ring, dt_ring, B_ring, cursor, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                     state_batch_indices, pad_slot_id, Launch.from_words(plan).mode == "flush", out)


def _replay_cuda(state, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z, dt_bias,
                 dt_softplus, state_batch_indices, pad_slot_id, plan, out) -> None:
    if x.shape[0] == 0:
        return
    params = _params(state, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z, dt_bias,
                     dt_softplus, state_batch_indices, pad_slot_id, out)
    _launch(state.dtype, plan, params, x, B.shape[-1])


_replay_op = define_op("mamba2_replay_decode",
                       ("state", "x_ring", "dt_ring", "B_ring", "cursor", "arrive", "coef", "step", "out"),
                       _replay_cpu, _replay_cuda)


def _state_update_cpu(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                      C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                      dt_bias: Optional[torch.Tensor], dt_softplus: bool, state_batch_indices: torch.Tensor,
                      pad_slot_id: int, plan: list[int], out: torch.Tensor) -> None:
    ref.state_update_(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out)


def _state_update_cuda(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, plan,
                       out) -> None:
    if x.shape[0] == 0:
        return
    params = _params(state, None, None, None, None, None, None, None, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                     state_batch_indices, pad_slot_id, out)
    _launch(state.dtype, plan, params, x, B.shape[-1])


_state_update_op = define_op("mamba2_state_update", ("state", "out"), _state_update_cpu, _state_update_cuda)


# Stored checkpoints (quantized, dual or stochastically rounded): the same steps over a Checkpoint's tensors. The ops
# take Checkpoint.op_tensors(), the spec's fields (checkpoint.spec_op_args) and the seed ahead of the plain ops'
# arguments.
def _replay_stored_cpu(state: torch.Tensor, state_scale: Optional[torch.Tensor], state_bscale: Optional[torch.Tensor],
                       read: Optional[torch.Tensor], read_scale: Optional[torch.Tensor],
                       read_bscale: Optional[torch.Tensor], flushes: Optional[torch.Tensor], state_format: str,
                       state_mode: str, master_format: str, stochastic_rounding: bool, seed: int,
                       x_ring: torch.Tensor, dt_ring: torch.Tensor, B_ring: torch.Tensor, cursor: torch.Tensor,
                       arrive: torch.Tensor, coef: torch.Tensor, step: torch.Tensor, x: torch.Tensor,
                       dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor],
                       z: Optional[torch.Tensor], dt_bias: Optional[torch.Tensor], dt_softplus: bool,
                       state_batch_indices: torch.Tensor, pad_slot_id: int, plan: list[int],
                       out: torch.Tensor) -> None:
    ckpt = Checkpoint.from_op_args((state, state_scale, state_bscale, read, read_scale, read_bscale, flushes),
                                   spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    _replay_cpu(ckpt, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                state_batch_indices, pad_slot_id, plan, out)


def _replay_stored_cuda(state, state_scale, state_bscale, read, read_scale, read_bscale, flushes, state_format,
                        state_mode, master_format, stochastic_rounding, seed, x_ring, dt_ring, B_ring, cursor, arrive,
                        coef, step, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, plan,
                        out) -> None:
    if x.shape[0] == 0:
        return
    stored = stored_fields((state_scale, state_bscale, read, read_scale, read_bscale, flushes), seed)
    params = _params(state, x_ring, dt_ring, B_ring, cursor, arrive, coef, step, x, dt, A, B, C, D, z, dt_bias,
                     dt_softplus, state_batch_indices, pad_slot_id, out, stored)
    _launch(spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), plan, params, x, B.shape[-1])


_replay_stored_op = define_op("mamba2_replay_decode_stored",
                              (*OP_TENSORS, "x_ring", "dt_ring", "B_ring", "cursor", "arrive", "coef", "step",
                               "out"), _replay_stored_cpu, _replay_stored_cuda)


def _state_update_stored_cpu(state: torch.Tensor, state_scale: Optional[torch.Tensor],
                             state_bscale: Optional[torch.Tensor], read: Optional[torch.Tensor],
                             read_scale: Optional[torch.Tensor], read_bscale: Optional[torch.Tensor],
                             flushes: Optional[torch.Tensor], state_format: str, state_mode: str, master_format: str,
                             stochastic_rounding: bool, seed: int, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                             B: torch.Tensor, C: torch.Tensor, D: Optional[torch.Tensor], z: Optional[torch.Tensor],
                             dt_bias: Optional[torch.Tensor], dt_softplus: bool, state_batch_indices: torch.Tensor,
                             pad_slot_id: int, plan: list[int], out: torch.Tensor) -> None:
    ckpt = Checkpoint.from_op_args((state, state_scale, state_bscale, read, read_scale, read_bscale, flushes),
                                   spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), seed)
    ref.state_update_(ckpt, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices, pad_slot_id, out)


def _state_update_stored_cuda(state, state_scale, state_bscale, read, read_scale, read_bscale, flushes, state_format,
                              state_mode, master_format, stochastic_rounding, seed, x, dt, A, B, C, D, z, dt_bias,
                              dt_softplus, state_batch_indices, pad_slot_id, plan, out) -> None:
    if x.shape[0] == 0:
        return
    stored = stored_fields((state_scale, state_bscale, read, read_scale, read_bscale, flushes), seed)
    params = _params(state, None, None, None, None, None, None, None, x, dt, A, B, C, D, z, dt_bias, dt_softplus,
                     state_batch_indices, pad_slot_id, out, stored)
    _launch(spec_of_op_args(state_format, state_mode, master_format, stochastic_rounding), plan, params, x, B.shape[-1])


_state_update_stored_op = define_op("mamba2_state_update_stored", (*OP_TENSORS, "out"),
                                    _state_update_stored_cpu, _state_update_stored_cuda)


# ---------------------------------------------------------------------------------------------------- public API
def validate_rows(state: torch.Tensor | Checkpoint, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices,
                  pad_slot_id, window: bool = False):
    """Checks of one step's row inputs (x [b,H,P], dt [b,H], B/C [b,G,N], z and out [b,H,P]) or, with ``window``, a
    verify window's ([b,T,...] each) against ``state`` [slots,H,P,N]; returns (slot indices, out)."""
    (slots, H, P, N), dev = chk.check_state(state)
    if N % 32:
        raise ValueError(f"state: d_state (last dim) must be a multiple of 32, got {N}")
    if P % 4:
        raise ValueError(f"state: head_dim (dim 2) must be a multiple of 4, got {P}")
    chk.check_tensor("x", x, (None,) * (2 if window else 1) + (H, P), chk.FLOAT_DTYPES, dev)
    lead = tuple(x.shape[:-2])  # (batch,) or (batch, T)
    chk.check_tensor("B", B, (*lead, None, N), (x.dtype,), dev, dtype_of="x")
    G = B.shape[-2]
    if G == 0 or H % G:
        raise ValueError(f"B: ngroups (dim {len(lead)}) must divide nheads={H}, got {G}")
    chk.check_tensor("C", C, (*lead, G, N), (x.dtype,), dev, dtype_of="x")
    chk.check_tensor("dt", dt, (*lead, H), (x.dtype, torch.float32), dev, inner_contiguous=0, dtype_of="x")
    chk.check_tensor("A", A, (H,), (torch.float32,), dev)
    chk.check_optional("D", D, (H,), (torch.float32,), dev)
    chk.check_optional("dt_bias", dt_bias, (H,), (torch.float32,), dev)
    chk.check_optional("z", z, (*lead, H, P), (x.dtype,), dev, dtype_of="x")
    if out is None:
        out = torch.empty_like(x)
    chk.check_tensor("out", out, (*lead, H, P), (x.dtype,), dev, dtype_of="x")
    if dev.type == "cuda":
        epl = N // 32
        if isinstance(state, torch.Tensor):
            chk.check_aligned("state", state, epl)
        chk.check_aligned("B", B, epl)
        chk.check_aligned("C", C, epl)
    idx = chk.slot_indices("state_batch_indices", state_batch_indices, lead[0], slots, pad_slot_id, dev)
    return idx, out


def _check_values(idx, slots, pad_slot_id, cursor, L, x, dt, A, B, C, D, z, dt_bias) -> None:  # noqa: N803
    chk.check_step_values(idx, slots, pad_slot_id, cursor, L, rows={"x": x, "dt": dt, "B": B, "C": C, "z": z},
                          params={"A": A, "D": D, "dt_bias": dt_bias})


def replay_decode(layer: Mamba2LayerCache, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                  C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                  dt_bias: torch.Tensor | None = None, dt_softplus: bool = True,
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                  out: torch.Tensor | None = None, mode: str = "auto",
                  plan: LaunchPlan | None = None, check_values: bool = False) -> torch.Tensor:
    """One ReplaySSM decode step for a batch of rows at their own cursors; returns ``out`` [b, H, P].

    ``layer``: a :class:`~trtllm_replayssm.core.cache.Mamba2LayerCache`. ``x`` [b,H,P], ``dt`` [b,H], ``A`` [H] fp32,
    ``B``/``C`` [b,G,N], ``D``/``dt_bias`` [H] fp32, ``z`` [b,H,P]. ``mode``: ``auto`` (flush every step when the
    batch cannot fill the GPU), ``replay`` or ``flush``. ``plan``: what to launch (default ``replay_plan(layer,
    batch, mode)``). ``check_values``: also check slot ids, cursors and finite inputs on CUDA (syncs; debugging).
    Rows the step skips and the NaN/Inf policy: docs/design.md. A layer with quantized, dual or stochastically
    rounded storage (``layer.storage``) reads and writes it as its spec says (docs/design.md, quantized state).
    """
    if not isinstance(layer, Mamba2LayerCache):
        raise TypeError(f"layer: expected a Mamba2LayerCache, got {type(layer).__name__}")
    state = layer.require_state() if layer.storage is None else layer.checkpoint()
    idx, out = validate_rows(state, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices, pad_slot_id)
    slots, H, P, N = state.shape
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
    if check_values:
        _check_values(idx, slots, pad_slot_id, layer.cursor, L, x, dt, A, B, C, D, z, dt_bias)
    elif dev.type == "cpu":
        chk.check_cursors(layer.cursor, idx, pad_slot_id, L)
    if dev.type == "cuda":  # the persistent kernel moves state tiles by bulk copies, row inputs by 4-byte copies
        if layer.storage is not None:
            chk.check_stored_for_kernels(state)
        chk.check_aligned("state", layer.state, 16 // layer.state.element_size())
        for name, t in (("x", x), ("z", z), ("layer.x_ring", layer.x_ring)):
            if t is not None:
                chk.check_aligned(name, t, 4 // t.element_size())
    if plan is None:
        plan = replay_plan(layer, x.shape[0], mode)
    else:
        checked_plan(plan, replay_plan_key(layer, x.shape[0]), mode)
    args = (layer.x_ring, layer.dt_ring, layer.B_ring, layer.cursor, layer.arrive, layer.coef, layer.step, x, dt, A, B,
            C, D, z, dt_bias, dt_softplus, idx, pad_slot_id, plan.words, out)
    if layer.storage is None:
        _replay_op(layer.state, *args)
    else:
        _replay_stored_op(*state.op_tensors(), *spec_op_args(state.spec), state.seed, *args)
    return out


def state_update(state: torch.Tensor | Checkpoint, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                 dt_bias: torch.Tensor | None = None, dt_softplus: bool = True,
                 state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                 out: torch.Tensor | None = None, plan: LaunchPlan | None = None,
                 check_values: bool = False) -> torch.Tensor:
    """Baseline single-token state update (read state, update, write state) on a slot pool or a Checkpoint (the
    master read and written every step, and the read copy written in dual mode); returns ``out``. ``plan``: what to
    launch (default ``state_update_plan(state, batch, x.dtype)``); ``check_values`` as :func:`replay_decode`.
    Stochastic rounding on CUDA needs the replay op's per-slot counters: use ``replay_decode(mode='flush')``."""
    idx, out = validate_rows(state, x, dt, A, B, C, D, z, dt_bias, out, state_batch_indices, pad_slot_id)
    stored = chk.check_stored_state_update(state)
    if check_values:
        _check_values(idx, state.shape[0], pad_slot_id, None, 1, x, dt, A, B, C, D, z, dt_bias)
    if plan is None:
        plan = state_update_plan(state, x.shape[0], x.dtype)
    else:
        checked_plan(plan, state_update_plan_key(state, x.shape[0], x.dtype))
    args = (x, dt, A, B, C, D, z, dt_bias, dt_softplus, idx, pad_slot_id, plan.words, out)
    if stored:
        _state_update_stored_op(*state.op_tensors(), *spec_op_args(state.spec), state.seed, *args)
    else:
        _state_update_op(state.master.data if isinstance(state, Checkpoint) else state, *args)
    return out
