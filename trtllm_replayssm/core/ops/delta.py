"""What the Gated DeltaNet and Kimi Delta Attention ops share: one kernel source (``plugins/delta_rule_decode.cu``,
KDA=0 / KDA=1), its parameter struct, the planners and the argument checks. ``gdn.py`` and ``kda.py`` add their gate
inputs and custom ops; ``per_channel_gate`` (KDA) is the one switch between them.
"""
from __future__ import annotations

import functools
from dataclasses import replace

import torch

from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core import crossovers
from trtllm_replayssm.core.cache import GDNLayerCache, KDALayerCache
from trtllm_replayssm.core.checkpoint import Checkpoint
from trtllm_replayssm.core.formats import StateSpec, get_dtype, state_spec
from trtllm_replayssm.core.jit.configs import KernelConfig, tile_choices, unique
from trtllm_replayssm.core.layouts import (DELTA_PARAMS, GDN_PREP_MAX_GROUP, delta_fold_bytes, delta_fused_bytes,
                                           delta_record_len, delta_size_checks, delta_stage_bytes,
                                           delta_verify_rec_floats, delta_verify_stage_bytes, key_ring_dtype,
                                           stored_state_params)
from trtllm_replayssm.core.limits import MAX_WINDOW, NUM_WARPS
from trtllm_replayssm.core.jit.loader import get_kernel
from trtllm_replayssm.core.jit.loader import launch as launch_kernel
from trtllm_replayssm.core.ops import conv
from trtllm_replayssm.core.ops import spec as spec_ops
from trtllm_replayssm.core.ops.launch import STATE_BLOCK, define_op, ptr, run_plan, step_rows, stored_fields, stride
from trtllm_replayssm.core.plans import (DECODE_MIN_CTAS_PER_SM, FOLD_FIRST_MIN_STAGES, FUSED_MAX_ROWS_PER_CTA,
                                         PLAIN_REPLAY_CTAS, TARGET_CTAS_PER_SM, Device, Launch, LaunchPlan, Tuning,
                                         adaptive_threshold, checked_plan, device_of, fitting_tiles, flush_ctas,
                                         flush_rows_apart, non_replay_plan, persistent_plan, persistent_verify_plan,
                                         programmatic_prep, replay_tuning, resolved_tail_fraction, stages_for,
                                         state_l2_hints, state_tile)
from trtllm_replayssm.core.reference import gdn as ref

DECODE_KERNELS = {"state": "delta_state_update_kernel", "flush": "delta_flush_decode_kernel",
                  "fused": "delta_fused_decode_kernel",
                  "prep": "delta_replay_prep_kernel", "main": "delta_replay_main_kernel",
                  "flush_rows": "delta_replay_flush_kernel"}
KERNELS = {**DECODE_KERNELS, "verify": "delta_verify_kernel", "verify_prep": "delta_verify_prep_kernel",
           "verify_main": "delta_verify_main_kernel",
           "per_draft_verify": "delta_per_draft_verify_kernel", "per_draft_commit": "delta_per_draft_commit_kernel"}
SUPPORTED_KEY_DIMS = (64, 128, 256)
MAX_ROWS_PER_CTA = 128  # one output lane per row: at most 32 rows per warp
REPLAY_STATE_DTYPES = (torch.float32, torch.bfloat16)  # replay measured faster than the baseline (fp16: not measured)
# Share of the replay main kernel's tiles claimed at run time by kernels with 4-byte plain states or stored
# checkpoints; kernels with 16-bit plain states keep the round-robin schedule (kTailClaims; docs/decisions.md, tail
# claims).
TAIL_FRACTION = 0.1
# Stored checkpoints stream whole heads of this many rows per persistent-kernel tile on sm_90 (the producer warp's
# per-tile work bounds small tiles; docs/decisions.md, GDN/KDA stored checkpoints stream whole heads).
WHOLE_HEAD_ROWS = 128
DEFAULT_TUNING = Tuning()


def whole_head_module(spec: StateSpec, value_dim: int, key_dim: int, per_channel_gate: bool) -> bool:
    """Whether a layer ships the whole-head module (WHOLE_HEAD_ROWS rows per persistent-kernel tile): stored
    checkpoints of 128-row heads and at most 128 key channels. With an NVFP4 read copy beside a master, not with
    stochastic rounding (its whole-head flush kernels spill on some target, or run slower) nor KDA's fp32 master (they
    spill on sm_100a/sm_103a) (docs/decisions.md, GDN/KDA stored checkpoints stream whole heads)."""
    if not (spec.stored and value_dim == WHOLE_HEAD_ROWS and key_dim <= WHOLE_HEAD_ROWS):
        return False
    if spec.dual and spec.format == "nvfp4":
        return not (spec.stochastic_rounding or (per_channel_gate and spec.master == "fp32"))
    return True


def whole_head_tiles(spec: StateSpec, value_dim: int, key_dim: int, per_channel_gate: bool, device: Device) -> bool:
    """Whether a replay with flush rows apart streams whole heads by default: the module exists and the GPU is a
    Hopper (measured there; sm_100 and later keep 64-row tiles)."""
    return device.major == 9 and whole_head_module(spec, value_dim, key_dim, per_channel_gate)


def claims_tail(state_dtype: torch.dtype | StateSpec) -> bool:
    """Whether the main kernel for ``state_dtype`` (a plain dtype or a StateSpec) claims its tail tiles
    (plugins/delta_rule_decode.cu kTailClaims)."""
    spec = state_spec(state_dtype, arg="state_dtype")
    return spec.stored or get_dtype(spec.checkpoint_format.name).bytes == 4


# ---------------------------------------------------------------------------------------------------- kernels
def kernel_config(per_channel_gate: bool, key_dim: int, value_dim: int, state_dtype: torch.dtype | StateSpec,
                  act_dtype: torch.dtype, rows_per_cta: int) -> KernelConfig:
    """The delta-rule decode module (baseline, flush and replay kernels; the speculative ones for plain checkpoints)
    for one shape, checkpoint spec (a plain state dtype or a StateSpec), activation dtype and row tile."""
    spec, ad = state_spec(state_dtype, arg="state_dtype"), get_dtype(act_dtype)
    return KernelConfig(
        family="kda" if per_channel_gate else "gdn", source="delta_rule_decode.cu",
        kernels=tuple((DECODE_KERNELS if spec.stored else KERNELS).values()),
        params=(("dk", key_dim), ("dv", value_dim), ("vtile", rows_per_cta), ("kda", int(per_channel_gate)),
                *stored_state_params(spec), ("act_t", ad.cuda)),
        layouts=(DELTA_PARAMS,), checks=functools.partial(_checks, spec, ad.torch))


def _checks(spec: StateSpec, act_dtype: torch.dtype, config: KernelConfig) -> str:
    per_channel = bool(config.param("kda"))
    key_elem = key_ring_dtype(act_dtype, per_channel).itemsize
    claims = "true" if claims_tail(spec) else "false"
    ctas = {arch: replay_ctas(spec, config.param("vtile"), Device(0, major, 0)) for arch, major in (("90", 9),
                                                                                                   ("100", 10))}
    return "\n".join((delta_size_checks(config.param("vtile"), config.param("dk"),
                                        spec.read_format.row_bytes(config.param("dk")), act_dtype.itemsize, key_elem,
                                        per_channel, not spec.stored),
                      f'static_assert(kTailClaims == {claims}, "kTailClaims differs from core/ops/delta.py '
                      f'claims_tail");',
                      f'static_assert(kReplayCtasPerSm == (__CUDA_ARCH__ >= 1000 ? {ctas["100"]} : {ctas["90"]}), '
                      f'"kReplayCtasPerSm differs from core/ops/delta.py replay_ctas");'))


def kernel_configs(per_channel_gate: bool, key_dim: int, value_dim: int, state_dtype: torch.dtype | StateSpec,
                   act_dtype: torch.dtype) -> list[KernelConfig]:
    """Every module a layer can launch at any batch size (all row tiles, a stored checkpoint's whole-head tile; with a
    plain checkpoint, the speculative commit's), and the conv1d decode step the TensorRT-LLM module runs right before
    its decode op."""
    spec = state_spec(state_dtype, arg="state_dtype")
    speculative = [] if spec.stored else [spec_ops.KERNEL_CONFIG]
    return unique([*(kernel_config(per_channel_gate, key_dim, value_dim, state_dtype, act_dtype, t)
                     for t in module_tiles(spec, value_dim, key_dim, per_channel_gate)), *speculative,
                   conv.conv_config(act_dtype)])


def module_tiles(spec: StateSpec, value_dim: int, key_dim: int, per_channel_gate: bool) -> list[int]:
    """The row tiles of a layer's shipped modules: every tile choice, and a stored checkpoint's whole head where its
    module ships (whole_head_module)."""
    tiles = list(tile_choices(value_dim, key_dim))
    return [*tiles, value_dim] if whole_head_module(spec, value_dim, key_dim, per_channel_gate) else tiles


# ---------------------------------------------------------------------------------------------------- planning
def replay_plan_key(layer: GDNLayerCache, batch: int, per_channel_gate: bool) -> tuple:
    """What a replay plan depends on: batch, shapes, ring length and dtypes."""
    return ("kda replay" if per_channel_gate else "gdn replay", batch, *layer.checkpoint().shape[1:],
            layer.k_ring.shape[1], layer.buffer_len, layer.spec.label, layer.u_ring.dtype)


def state_update_plan_key(state: torch.Tensor | Checkpoint, batch: int, act_dtype: torch.dtype,
                          per_channel_gate: bool) -> tuple:
    spec = state.spec.label if isinstance(state, Checkpoint) else state.dtype
    return ("kda state update" if per_channel_gate else "gdn state update", batch, *state.shape[1:], spec, act_dtype)


def replay_plan(layer: GDNLayerCache, batch: int, per_channel_gate: bool, mode: str = "auto",
                tuning: Tuning = DEFAULT_TUNING, device: Device | None = None) -> LaunchPlan:
    """The launch plan of a GDN (``per_channel_gate`` False) or KDA replay decode step of ``batch`` rows."""
    _, HV, V, K = layer.checkpoint().shape  # values (an NVFP4 master packs two per byte)
    L, act = layer.buffer_len, layer.u_ring.dtype
    dev = device or device_of(layer.state.device)
    key = replay_plan_key(layer, batch, per_channel_gate)
    stored = layer.storage is not None
    other = non_replay_plan("delta-rule replay decode", mode, key, batch * HV,
                            stored or layer.state.dtype in REPLAY_STATE_DTYPES,
                            crossovers.entry("kda" if per_channel_gate else "gdn", layer.spec.label, dev.arch,
                                             launch=crossovers.launch_of(tuning.programmatic_state)),
                            dev, tuning,
                            lambda: _state_kernel_plan("flush", key, V, K, HV, batch, dev, tuning),
                            lambda: _fused_plan(key, V, K, HV, L, act, per_channel_gate, batch, dev, tuning))
    if other is not None:
        return other
    bound = stored_replay_ctas(layer.spec, dev)
    tuning = replay_tuning(layer.spec, tuning, bound, bound)
    row_bytes, act_elem = layer.spec.read_format.row_bytes(K), get_dtype(act).bytes
    key_elem = key_ring_dtype(act, per_channel_gate).itemsize
    apart = flush_rows_apart(tuning, layer.spec.stored)
    tile = _row_tile(V, K, batch * HV, dev, tuning)
    if tuning.rows_per_cta is None:
        if apart and whole_head_tiles(layer.spec, V, K, per_channel_gate, dev) and tile == max(tile_choices(V, K)):
            tile = V
        else:
            tile = _fitting_tile(V, K, L, row_bytes, act_elem, tile, per_channel_gate, tuning.ctas_per_sm, key_elem)
    tuning = whole_head_tuning(layer.spec, tile, dev, tuning)
    num_tiles = batch * HV * (V // tile)
    if apart and not claims_tail(layer.spec):
        raise ValueError(f"flush_apart: flush rows apart need a main kernel that claims its tail tiles (4-byte or "
                         f"stored checkpoints), not {layer.spec.label}")
    fraction = resolved_tail_fraction(tuning, TAIL_FRACTION) if claims_tail(layer.spec) else None
    fold = 0 if apart else delta_fold_bytes(L, K, key_elem, per_channel_gate)
    main = persistent_plan(delta_stage_bytes(L, tile, K, row_bytes, act_elem, per_channel_gate), num_tiles, fold,
                           per_channel_gate, fraction, dev, tuning)
    items = batch * layer.k_ring.shape[1]  # a prep warp per (row, key head) for GDN, per (row, value head) for KDA
    flush_tile = _flush_tile(layer.spec, V, K, per_channel_gate, tile, tuning) if apart else tile
    return LaunchPlan("replay", key, tile, (main.grid, 1, 1), main.stages, main.stage_bytes, main.fold_bytes,
                      main.tail_start, prep_grid=(-(-items // NUM_WARPS), 1, 1), prep_threads=32 * NUM_WARPS,
                      programmatic_prep=programmatic_prep(tuning), tail_fraction=fraction, num_tiles=num_tiles,
                      flush_ctas=flush_ctas(batch * HV * (V // flush_tile), apart, dev, tuning),
                      flush_bytes=delta_fused_bytes(L, flush_tile, K, key_elem, act_elem, per_channel_gate)
                      if apart else 0, flush_rows_per_cta=flush_tile if flush_tile != tile else 0)


def _flush_tile(spec: StateSpec, value_dim: int, key_dim: int, per_channel_gate: bool, tile: int,
                tuning: Tuning) -> int:
    """The row tile of the module whose flush-rows kernel folds a replay's flush rows: the tuning's, else the main
    kernel's ``tile``; one of the layer's shipped modules (kernel_configs)."""
    if tuning.flush_rows_per_cta is None:
        return tile
    shipped = module_tiles(spec, value_dim, key_dim, per_channel_gate)
    if tuning.flush_rows_per_cta not in shipped:
        raise ValueError(f"flush_rows_per_cta: expected one of the layer's row tiles {shipped}, got "
                         f"{tuning.flush_rows_per_cta}")
    return tuning.flush_rows_per_cta


def replay_ctas(spec: StateSpec, tile: int, device: Device) -> int:
    """The replay main kernel's launch bounds in CTAs per SM for a ``spec`` checkpoint and ``tile``-row module
    (kReplayCtasPerSm): PLAIN_REPLAY_CTAS for a plain one, else stored_replay_ctas, one for whole heads on sm_100 and
    later (not measured there)."""
    if not spec.stored:
        return PLAIN_REPLAY_CTAS
    return 1 if tile >= WHOLE_HEAD_ROWS and device.major != 9 else stored_replay_ctas(spec, device)


def stored_replay_ctas(spec: StateSpec, device: Device) -> int:
    """The replay main kernel's CTAs per SM on a stored checkpoint (kReplayCtasPerSm; it never folds): 4 on sm_90; on
    sm_100 and later 2 with stochastic rounding and a read copy, else 3 (replay_ctas: 1 for whole heads)."""
    return 4 if device.major == 9 else 2 if spec.stochastic_rounding and spec.dual else 3


def whole_head_tuning(spec: StateSpec, tile: int, device: Device, tuning: Tuning) -> Tuning:
    """``tuning`` with at most the launch bounds of the ``tile``-row module's main kernel (replay_ctas), applied once
    the tile is known: whole heads of a stored checkpoint run 1 CTA per SM on sm_100 and later."""
    return replace(tuning, ctas_per_sm=min(tuning.ctas_per_sm, replay_ctas(spec, tile, device)))


def state_update_plan(state: torch.Tensor | Checkpoint, batch: int, act_dtype: torch.dtype, per_channel_gate: bool,
                      tuning: Tuning = DEFAULT_TUNING, device: Device | None = None) -> LaunchPlan:
    """The launch plan of a baseline GDN / KDA step of ``batch`` rows of the pool ``state`` [slots, HV, V, K]."""
    _, HV, V, K = state.shape
    dev = device or device_of(state.device)
    key = state_update_plan_key(state, batch, act_dtype, per_channel_gate)
    if not dev.is_cuda:
        return LaunchPlan("baseline", key, 0, (0, 0, 0))
    return _state_kernel_plan("baseline", key, V, K, HV, batch, dev, tuning)


def _state_kernel_plan(mode: str, key: tuple, V: int, K: int, HV: int, batch: int, dev: Device,
                       tuning: Tuning) -> LaunchPlan:
    """The baseline, flush or one-launch replay kernel's grid; the one-launch replay hints L2 on every grid (its ring
    records too; measured)."""
    tile = _row_tile(V, K, batch * HV, dev, tuning, FUSED_MAX_ROWS_PER_CTA if mode == "fused" else None,
                     DECODE_MIN_CTAS_PER_SM)
    grid = (V // tile, HV, batch)
    return LaunchPlan(mode, key, tile, grid, programmatic=tuning.programmatic_state,
                      l2_hints=state_l2_hints(grid, dev, tuning, any_grid=mode == "fused"))


def _fused_plan(key: tuple, V: int, K: int, HV: int, L: int, act: torch.dtype, per_channel_gate: bool, batch: int,
                dev: Device, tuning: Tuning) -> LaunchPlan:
    """The one-launch replay: the state kernels' grid, each CTA staging its rows' ring in ``fold_bytes`` of shared
    memory."""
    plan = _state_kernel_plan("fused", key, V, K, HV, batch, dev, tuning)
    fused = delta_fused_bytes(L, plan.rows_per_cta, K, key_ring_dtype(act, per_channel_gate).itemsize,
                              get_dtype(act).bytes, per_channel_gate)
    return replace(plan, fold_bytes=fused)


def _row_tile(value_dim: int, key_dim: int, work_items: int, dev: Device, tuning: Tuning,
              max_rows: int | None = None, min_ctas_per_sm: float = TARGET_CTAS_PER_SM) -> int:
    tile = state_tile(value_dim, key_dim, work_items, dev, tuning, max_rows, min_ctas_per_sm)
    if tile > MAX_ROWS_PER_CTA:
        raise ValueError(f"rows_per_cta: expected at most {MAX_ROWS_PER_CTA} rows per CTA, got {tile}")
    return tile


@functools.lru_cache(maxsize=None)
def _fitting_tile(value_dim: int, key_dim: int, L: int, state_row_bytes: int, act_elem: int, tile: int,
                  per_channel_gate: bool, ctas_per_sm: int, key_elem: int) -> int:
    """The heuristic's row tile, lowered until two stages fit per CTA (KDA: and the fold buffer with them)."""
    stage = {t: delta_stage_bytes(L, t, key_dim, state_row_bytes, act_elem, per_channel_gate)
             for t in tile_choices(value_dim, key_dim)}
    fits = fitting_tiles(stage, tile, act_elem, ctas_per_sm)
    if not fits:
        return tile
    if per_channel_gate:  # a KDA fold without the buffer loads its keys itself: worth a smaller tile (measured)
        fold = delta_fold_bytes(L, key_dim, key_elem, True)
        buffered = [t for t in fits if stages_for(stage[t], ctas_per_sm, fold) >= FOLD_FIRST_MIN_STAGES]
        if buffered:
            return max(buffered)
    return max(fits)


# ---------------------------------------------------------------------------------------------------- launching
def params(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, gate, beta, A_log, dt_bias,  # noqa: N803
           scale: float, lower_bound: float | None, idx, pad_slot_id: int, force_flush: bool, out, *,
           key_heads: int | None = None, window: int = 1, accepted=None, inter=None,
           stored: dict[str, int] | None = None):
    """The kernel parameter struct (rings None for the baseline kernel; token tensors None for the commit kernels,
    which then name the key heads). Speculative kernels take ``window`` tokens per row as rows ``b T + t`` of
    [b T, ...] token tensors, ``accepted`` [b] and the per-draft states ``inter`` [b, T, HV, V, K]. ``stored``: a
    stored checkpoint's fields (launch.stored_fields; ``state`` is then its master data)."""
    return DELTA_PARAMS.pack(**(stored or stored_fields()),
        state=ptr(state), u_ring=ptr(u_ring), k_ring=ptr(k_ring), g_ring=ptr(g_ring), cursor=ptr(cursor),
        arrive=ptr(arrive), coef=ptr(coef), step=step_rows(step), q=ptr(q), k=ptr(k), v=ptr(v), gate=ptr(gate),
        beta=ptr(beta), A_log=ptr(A_log), dt_bias=ptr(dt_bias), slot_idx=ptr(idx), out=ptr(out),
        accepted=ptr(accepted), inter=ptr(inter),
        s_state_slot=state.stride(0), s_state_head=state.stride(1), s_ur_slot=stride(u_ring, 0),
        s_ur_head=stride(u_ring, 1), s_kr_slot=stride(k_ring, 0), s_kr_head=stride(k_ring, 1),
        s_gr_slot=stride(g_ring, 0), s_gr_head=stride(g_ring, 1), s_coef_row=stride(coef, 0),
        s_inter_b=stride(inter, 0), s_inter_t=stride(inter, 1), s_inter_h=stride(inter, 2),
        s_q_b=stride(q, 0), s_q_h=stride(q, 1), s_k_b=stride(k, 0), s_k_h=stride(k, 1), s_v_b=stride(v, 0),
        s_v_h=stride(v, 1), s_gate_b=stride(gate, 0), s_gate_h=stride(gate, 1), s_beta_b=stride(beta, 0),
        s_beta_h=stride(beta, 1), s_out_b=stride(out, 0), s_out_h=stride(out, 1),
        scale=float(scale), lower_bound=0.0 if lower_bound is None else float(lower_bound),
        num_k_heads=q.shape[1] if key_heads is None else key_heads, num_v_heads=state.shape[1],
        L=u_ring.shape[2] if u_ring is not None else 1,
        pad_slot_id=pad_slot_id, slots=state.shape[0], gate_is_f32=int(gate is not None and gate.dtype == torch.float32),
        beta_is_f32=int(beta is not None and beta.dtype == torch.float32), has_lower_bound=int(lower_bound is not None),
        force_flush=int(force_flush), window=window, batch=idx.shape[0], stages=0, stage_bytes=0, fold_bytes=0,
        tail_start=0, flush_apart=0, l2_hints=0)


def run(per_channel_gate: bool, plan: list[int], state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v,
        gate, beta, A_log, dt_bias, scale, lower_bound, idx, pad_slot_id, out,  # noqa: N803
        stored: tuple | None = None) -> None:
    """A custom op's CUDA body: the kernels of ``plan`` (rings None for the baseline). ``stored``: a stored
    checkpoint's (tensors besides the master data in Checkpoint.op_tensors order, spec, seed); ``state`` its master
    data."""
    if q.shape[0] == 0:
        return
    launch = Launch.from_words(plan)
    fields, spec = (None, state.dtype) if stored is None else (stored_fields(stored[0], stored[2]), stored[1])
    struct = params(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, q, k, v, gate, beta, A_log, dt_bias,
                    scale, lower_bound, idx, pad_slot_id, launch.mode == "flush", out, stored=fields)
    config = kernel_config(per_channel_gate, q.shape[2], v.shape[2], spec, q.dtype, launch.rows_per_cta)
    flush_config = (kernel_config(per_channel_gate, q.shape[2], v.shape[2], spec, q.dtype, launch.flush_rows_per_cta)
                    if launch.flush_rows_per_cta else None)
    run_plan(config, KERNELS, launch, struct, q.device, prep_carveout=True, flush_config=flush_config)


def launch_rows(kernel: str, per_channel_gate: bool, act_dtype: torch.dtype, rows_per_cta: int, state: torch.Tensor,
                batch: int, struct) -> None:
    """One of the speculative kernels (``kernel``: a KERNELS key) over grid (V / rows_per_cta, HV, batch)."""
    if batch == 0:
        return
    _, HV, V, K = state.shape
    config = kernel_config(per_channel_gate, K, V, state.dtype, act_dtype, rows_per_cta)
    launch_kernel(get_kernel(config, KERNELS[kernel], state.device), (V // rows_per_cta, HV, batch), STATE_BLOCK,
                  struct)


def run_per_draft(per_channel_gate: bool, state, inter, q, k, v, gate, beta, A_log, dt_bias,  # noqa: N803
                  scale: float, lower_bound: float | None, idx, pad_slot_id: int, rows_per_cta: int, out) -> None:
    """The per-draft verify kernel on a window's inputs [b, T, ...] (GDN: ``gate`` = a; KDA: the raw gate g)."""
    struct = params(state, None, None, None, None, None, None, None, tokens(q), tokens(k), tokens(v), tokens(gate),
                    tokens(beta), A_log, dt_bias, scale, lower_bound, idx, pad_slot_id, False, tokens(out),
                    window=q.shape[1], inter=inter)
    launch_rows("per_draft_verify", per_channel_gate, q.dtype, rows_per_cta, state, q.shape[0], struct)


def tokens(t: torch.Tensor | None) -> torch.Tensor | None:
    """A window's per-token tensor [b, T, ...] as the kernels index it, [b T, ...] (a view where the strides allow)."""
    return None if t is None else t.flatten(0, 1)


# ---------------------------------------------------------------------------------------------------- validation
def resolve_scale(scale: float | None, key_dim: int) -> float:
    """``scale`` as a finite float (default ``key_dim ** -0.5``)."""
    value = ref.resolve_scale(scale, key_dim)
    if value != value or value in (float("inf"), float("-inf")):
        raise ValueError(f"scale: expected a finite float, got {scale}")
    return value


def validate_common(state: torch.Tensor | Checkpoint, q, k, v, out, state_batch_indices, pad_slot_id,
                    window: bool = False) -> tuple:
    """Checks shared by GDN and KDA of one step's q, k [b,H,K], v and out [b,HV,V] or, with ``window``, a verify
    window's ([b,T,...] each, T = 1..MAX_WINDOW, out's dims 0 and 1 mergeable); returns ``(idx, out, dims)`` with
    dims = (slots, H, HV, V, K)."""
    (slots, HV, V, K), dev = chk.check_state(state)
    if K not in SUPPORTED_KEY_DIMS:
        raise ValueError(f"state: key dim (last dim) must be one of {SUPPORTED_KEY_DIMS}, got {K}")
    if V % NUM_WARPS:
        raise ValueError(f"state: value dim (dim 2) must be a multiple of {NUM_WARPS}, got {V}")
    chk.check_tensor("q", q, (None,) * (3 if window else 2) + (K,), chk.FLOAT_DTYPES, dev)
    lead, H = tuple(q.shape[:-2]), q.shape[-2]  # lead: (batch,) or (batch, T)
    if window and not 1 <= lead[1] <= MAX_WINDOW:
        raise ValueError(f"q: window tokens (dim 1) must be 1..{MAX_WINDOW}, got {lead[1]}")
    if H == 0 or HV % H:
        raise ValueError(f"q: key heads (dim {len(lead)}) must divide the value heads of the state ({HV}), got {H}")
    chk.check_tensor("k", k, (*lead, H, K), (q.dtype,), dev, dtype_of="q")
    chk.check_tensor("v", v, (*lead, HV, V), (q.dtype,), dev, dtype_of="q")
    if out is None:
        out = torch.empty((*lead, HV, V), dtype=q.dtype, device=dev)
    chk.check_tensor("out", out, (*lead, HV, V), (q.dtype,), dev, dtype_of="q")
    if window and lead[0] > 1 and lead[1] > 1 and out.stride(0) != lead[1] * out.stride(1):
        raise ValueError(f"out: dims 0 and 1 must be mergeable (stride(0) == T * stride(1)), got strides "
                         f"{list(out.stride())}")
    if dev.type == "cuda":
        for name, t in (("state", state), ("q", q), ("k", k)):
            if isinstance(t, torch.Tensor):
                chk.check_aligned(name, t, K // 32)
    idx = chk.slot_indices("state_batch_indices", state_batch_indices, lead[0], slots, pad_slot_id, dev)
    return idx, out, (slots, H, HV, V, K)


def validate_rings(layer: GDNLayerCache, dims: tuple, act_dtype: torch.dtype, per_channel_gate: bool,
                   idx: torch.Tensor, pad_slot_id: int, replay_cursor: bool = True) -> None:
    """Ring/cursor/scratch tensors of ``layer`` against the step's dims (slots, H, HV, V, K) and slot ids ``idx``
    (on CPU, ``replay_cursor``: the replay cursors of their slots; a verify checks its cursor words itself)."""
    batch = idx.shape[0]
    slots, H, HV, V, K = dims
    chk.check_scratch_rows(batch, slots)
    L, dev = layer.buffer_len, layer.state.device
    chk.check_tensor("layer.u_ring", layer.u_ring, (slots, HV, L, V), (act_dtype,), dev, inner_contiguous=2)
    key_heads = HV if per_channel_gate else H  # KDA: one pre-decayed key per value head
    chk.check_tensor("layer.k_ring", layer.k_ring, (slots, key_heads, L, K), (key_ring_dtype(act_dtype,
                     per_channel_gate),), dev, inner_contiguous=2)
    gate_shape, inner = ((slots, HV, L, K), 2) if per_channel_gate else ((slots, HV, L), 1)
    chk.check_tensor("layer.g_ring", layer.g_ring, gate_shape, (torch.float32,), dev, inner_contiguous=inner)
    chk.check_tensor("layer.cursor", layer.cursor, (slots,), (torch.int32,), dev)
    chk.check_tensor("layer.arrive", layer.arrive, (slots,), (torch.int32,), dev)
    chk.check_tensor("layer.coef", layer.coef, (slots, HV, delta_record_len(L, K, per_channel_gate)),
                     (torch.float32,), dev, inner_contiguous=2)
    chk.check_tensor("layer.step", layer.step, (slots + 1,), (torch.int32,), dev)
    if dev.type == "cpu" and replay_cursor:
        chk.check_cursors(layer.cursor, idx, pad_slot_id, L)
    if dev.type == "cuda":  # state tiles move by bulk copies, row inputs by 4-byte copies
        if layer.storage is not None:
            chk.check_stored_for_kernels(layer.checkpoint())
        chk.check_aligned("state", layer.state, 16 // layer.state.element_size())
        chk.check_aligned("layer.u_ring", layer.u_ring, 4 // layer.u_ring.element_size())
        chk.check_aligned("layer.k_ring", layer.k_ring, K // 32)
        if per_channel_gate:
            chk.check_aligned("layer.g_ring", layer.g_ring, K // 32)



# ---------------------------------------------------------------------------------------------------- speculative
def check_plain_for_kernels(layer: GDNLayerCache, op: str) -> None:
    """The speculative kernels read and write plain fp32/fp16/bf16 checkpoints only."""
    if layer.storage is not None and layer.state.device.type == "cuda":
        raise NotImplementedError(f"{op}: {layer.spec.label} checkpoints have no speculative CUDA kernels; CPU "
                                  f"tensors run the reference")


def check_accepted(accepted: object, batch: int, device: torch.device) -> torch.Tensor:
    """``accepted`` [batch] int32 on ``device`` (values 1..T: checked by the CPU references; CUDA skips other rows)."""
    return chk.check_tensor("accepted", accepted, (batch,), (torch.int32,), device)


def check_inter(inter: object, state: torch.Tensor, batch: int, window: int) -> torch.Tensor:
    """Per-draft states ``inter`` [batch, T, HV, V, K] in the state's dtype, the last two dims dense."""
    _, HV, V, K = state.shape
    chk.check_tensor("inter", inter, (batch, window, HV, V, K), (state.dtype,), state.device, inner_contiguous=2,
                     dtype_of="state")
    if state.device.type == "cuda":
        chk.check_aligned("inter", inter, K // 32)
    return inter


def window_tile(state: torch.Tensor, batch: int) -> int:
    """Row tile of the speculative kernels: the state kernels' heuristic (plans.state_tile)."""
    _, HV, V, K = state.shape
    return _row_tile(V, K, batch * HV, device_of(state.device), DEFAULT_TUNING)


# The persistent verify (prep + delta_verify_main_kernel) from this many (batch row, value head) work items per SM,
# the grid kernel (delta_verify_kernel) below: H100, T = 4, grid / persistent µs per step (kernel times): Qwen3.5-4B
# batch 16 39.9 / 48.5 (64-row tiles), batch 32 74.2 / 54.4 (docs/decisions.md, GDN/KDA grid verify: 32-row tiles).
VERIFY_PERSISTENT_MIN_WORK_PER_SM = 5
# The grid verify's row tile: every CTA computes its (row, value head)'s window coefficients, so fewer, larger tiles
# pay: H100, T = 4, Qwen3.5-4B, µs per step (kernel times) with 8 / 32-row tiles: batch 1 9.8 / 8.5, batch 8 50.8 /
# 23.0 (docs/decisions.md, GDN/KDA grid verify: 32-row tiles).
VERIFY_GRID_ROWS_PER_CTA = 32
# The persistent verify's tuning: two CTAs per SM of two stages (at most verify_ctas_per_sm).
VERIFY_TUNING = Tuning(ctas_per_sm=2, stages=2)


def verify_ctas_per_sm(key_dim: int) -> int:
    """The persistent verify kernel's CTAs per SM (its launch bounds; plugins/delta_rule_decode.cu kVerifyCtasPerSm):
    2 up to 128 key channels, 1 above."""
    return 2 if key_dim <= 128 else 1


def verify_plan(layer: GDNLayerCache, batch: int, window: int, tuning: Tuning = VERIFY_TUNING,
                device: Device | None = None) -> LaunchPlan:
    """The launch plan of a GDN/KDA verify of ``batch`` rows and windows of ``window`` tokens: the grid kernel
    (mode ``grid``, no prep, launched plainly on VERIFY_GRID_ROWS_PER_CTA-row tiles) below the tuning's
    ``adaptive_threshold`` work items (batch x value heads; default VERIFY_PERSISTENT_MIN_WORK_PER_SM per SM) or for
    GDN with more than GDN_PREP_MAX_GROUP value heads per key head, else the verify prep kernel (a CTA per row and key
    ring head: key head for GDN, value head for KDA) and the persistent verify kernel (mode ``replay``) with the
    largest row tile up to the state kernels' heuristic whose stage fits twice per CTA."""
    _, HV, V, K = layer.require_state().shape
    L, dev = layer.buffer_len, device or device_of(layer.state.device)
    key = verify_plan_key(layer, batch, window)
    if not dev.is_cuda:
        return LaunchPlan("replay", key, 0, (0, 0, 0))
    work, key_heads = batch * HV, layer.k_ring.shape[1]
    small = work < adaptive_threshold(VERIFY_PERSISTENT_MIN_WORK_PER_SM, dev, tuning)
    if small or HV // key_heads > GDN_PREP_MAX_GROUP:
        tile = _row_tile(V, K, work, dev, tuning, VERIFY_GRID_ROWS_PER_CTA, min_ctas_per_sm=0)
        return LaunchPlan("grid", key, tile, (V // tile, HV, batch))
    state_elem, act_elem, key_elem = layer.state.element_size(), layer.u_ring.element_size(), layer.k_ring.element_size()
    per_channel_gate = isinstance(layer, KDALayerCache)
    stage = {t: delta_verify_stage_bytes(L, window, t, K, state_elem, act_elem, key_elem, per_channel_gate)
             for t in tile_choices(V, K)}
    tuning = replace(tuning, ctas_per_sm=min(tuning.ctas_per_sm, verify_ctas_per_sm(K)))
    return persistent_verify_plan(key, stage, state_tile(V, K, work, dev, tuning), work * V, act_elem, 0,
                                  resolved_tail_fraction(tuning, TAIL_FRACTION), dev, tuning,
                                  prep_grid=(key_heads, batch, 1),
                                  prep_threads=32 * NUM_WARPS, programmatic_prep=programmatic_prep(tuning))


def verify_plan_key(layer: GDNLayerCache, batch: int, window: int) -> tuple:
    """What a verify plan depends on: batch, window, shapes, ring length and dtypes."""
    return ("delta verify", batch, window, *layer.require_state().shape[1:], layer.buffer_len, layer.state.dtype,
            layer.u_ring.dtype)


def resolved_verify_plan(layer: GDNLayerCache, v: torch.Tensor, tuning: Tuning, plan: LaunchPlan | None) -> LaunchPlan:
    """``plan`` checked against the call on the window's values ``v`` [b, T, HV, V] (default: :func:`verify_plan`);
    the persistent verify copies v rows in 16-byte chunks where aligned, else 4-byte words."""
    batch, window = v.shape[:2]
    if plan is None:
        plan = verify_plan(layer, batch, window, tuning)
    else:
        checked_plan(plan, verify_plan_key(layer, batch, window))
    if plan.mode == "replay" and v.is_cuda:
        chk.check_aligned("v", v, 4 // v.element_size())
    return plan


def verify_scratch(layer: GDNLayerCache, batch: int, window: int) -> torch.Tensor:
    """The verify records of one call, [batch, HV, VerifyRec stride] fp32 (written by the verify prep kernel)."""
    _, HV, _, K = layer.require_state().shape
    return torch.empty(batch, HV, delta_verify_rec_floats(layer.buffer_len, K, window), dtype=torch.float32,
                       device=layer.state.device)


def run_verify(per_channel_gate: bool, plan: list[int], state, u_ring, k_ring, g_ring, cursor, arrive, coef, step,
               q, k, v, gate, beta, A_log, dt_bias, scale, lower_bound, idx, pad_slot_id, out) -> None:  # noqa: N803
    """A verify op's CUDA body on a window's inputs [b, T, ...]: the kernels of ``plan``."""
    if q.shape[0] == 0:
        return
    launch = Launch.from_words(plan)
    struct = params(state, u_ring, k_ring, g_ring, cursor, arrive, coef, step, tokens(q), tokens(k), tokens(v),
                    tokens(gate), tokens(beta), A_log, dt_bias, scale, lower_bound, idx, pad_slot_id, False,
                    tokens(out), window=q.shape[1])
    config = kernel_config(per_channel_gate, q.shape[-1], v.shape[-1], state.dtype, q.dtype, launch.rows_per_cta)
    names = {"prep": KERNELS["verify_prep"], "main": KERNELS["verify_main"], "grid": KERNELS["verify"]}
    run_plan(config, names, launch, struct, q.device, prep_carveout=True)


def _per_draft_commit_cpu(state: torch.Tensor, inter: torch.Tensor, accepted: torch.Tensor,
                          state_batch_indices: torch.Tensor, pad_slot_id: int, rows_per_cta: int) -> None:
    ref.per_draft_commit_(state, inter, accepted, state_batch_indices, pad_slot_id)


def _per_draft_commit_cuda(state, inter, accepted, state_batch_indices, pad_slot_id, rows_per_cta) -> None:
    struct = params(state, None, None, None, None, None, None, None, None, None, None, None, None, None, None, 1.0,
                    None, state_batch_indices, pad_slot_id, False, None, key_heads=state.shape[1],
                    window=inter.shape[1], accepted=accepted, inter=inter)
    launch_rows("per_draft_commit", False, state.dtype, rows_per_cta, state, state_batch_indices.shape[0], struct)


_per_draft_commit_op = define_op("delta_per_draft_commit", ("state",), _per_draft_commit_cpu, _per_draft_commit_cuda)


def per_draft_commit(state: torch.Tensor, inter: torch.Tensor, accepted: torch.Tensor,
                     state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1) -> None:
    """After a per-draft verify (GDN or KDA): row b's slot state <- ``inter[b, accepted[b] - 1]``. ``state``
    [slots,HV,V,K], ``inter`` [b,T,HV,V,K] (state dtype), ``accepted`` [b] int32 (1..T; on CUDA a row outside is
    skipped, the CPU reference raises)."""
    (slots, _, _, _), dev = chk.check_state(state)
    chk.check_tensor("inter", inter, (None, None, *state.shape[1:]), (state.dtype,), dev, inner_contiguous=2,
                     dtype_of="state")
    batch, window = inter.shape[:2]
    check_inter(inter, state, batch, window)
    check_accepted(accepted, batch, dev)
    idx = chk.slot_indices("state_batch_indices", state_batch_indices, batch, slots, pad_slot_id, dev)
    _per_draft_commit_op(state, inter, accepted, idx, pad_slot_id, window_tile(state, batch))
