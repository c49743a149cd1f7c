"""Launch-side helpers shared by the ops: device facts, adaptive mode, row-tile choice, ctypes parameter structs."""
from __future__ import annotations

import ctypes
import functools
import os

import torch

from trtllm_replayssm.core.jit.configs import NUM_WARPS, rows_per_cta_choices, tile_choices
from trtllm_replayssm.core.jit.loader import allow_dynamic_shared, launch


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Where ``mode='auto'`` switches from flushing every step (baseline traffic, no ring) to replay, in work items
# (batch x heads) per SM, from the H200 measurements in benchmarks/results (run 6): replay loses at batch 8 and wins
# at batch 64 for every benchmark shape, i.e. between ~4 and ~15 x SMs (replay over baseline, fp32 state: Mamba-2
# Nemotron-3-Nano-4B, 96 heads, 0.86x at 8, 1.61x at 64; GDN Qwen3.5-4B, 32 value heads, 0.49x / 1.25x; KDA
# Kimi-Linear, 32 heads, 0.44x / 1.28x).
REPLAY_MIN_WORK_PER_SM = {"mamba2": 8, "gdn": 8, "kda": 8}
# State dtypes whose replay is measured faster than the baseline, per family (fp16 states of GDN/KDA: not measured).
REPLAY_STATE_DTYPES = {"mamba2": (torch.float32, torch.float16, torch.bfloat16),
                       "gdn": (torch.float32, torch.bfloat16), "kda": (torch.float32, torch.bfloat16)}


def adaptive_threshold(family: str, device: torch.device) -> int:
    """Work items (batch x heads) below which ``mode='auto'`` flushes every step; env override
    ``TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD`` (work items, all families)."""
    env = os.environ.get("TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD")
    if env is not None:
        return int(env)
    index = device.index if device.index is not None else torch.cuda.current_device()
    return REPLAY_MIN_WORK_PER_SM[family] * sm_count(index)


def force_flush_for(family: str, mode: str, batch: int, heads: int, state_dtype: torch.dtype,
                    device: torch.device) -> bool:
    """Whether a step runs in flush-every-step mode: always for ``flush``, never for ``replay``; ``auto`` flushes
    where replay is measured slower than the baseline (small batch x heads, or a state dtype not yet faster)."""
    if mode == "flush":
        return True
    if mode == "replay" or device.type != "cuda":
        return False
    if state_dtype not in REPLAY_STATE_DTYPES[family] or not replay_capable(device):
        return True
    return batch * heads < adaptive_threshold(family, device)


def rows_per_cta(rows: int, cols: int, work_items: int, device: torch.device, override: int | None = None) -> int:
    """Row tile for a (rows x cols) state per head: fill the GPU at small batch, big tiles at large batch."""
    choices = tile_choices(rows, cols)
    if override is not None:
        if override not in rows_per_cta_choices(rows):
            raise ValueError(f"rows_per_cta: expected one of {rows_per_cta_choices(rows)}, got {override}")
        return override
    # Enough CTAs for ~24 per SM (measured best at batch 8 and 64 on the H200); large batches take the largest tile.
    target_ctas = 24 * sm_count(device.index if device.index is not None else torch.cuda.current_device())
    fitting = [t for t in choices if work_items * (rows // t) >= target_ctas]
    return max(fitting) if fitting else min(choices)


# Persistent replay kernels: CTAs per SM and the shared memory they split into tile stages (sm_90 / sm_100: 228 KiB
# per SM, 1 KiB of it reserved per CTA). Override (ctas_per_sm, stages) for benchmark sweeps; None = the plan below.
PERSISTENT_CTAS_PER_SM = 3
SHARED_BYTES_PER_SM = 228 * 1024
MAX_STAGES = 8  # plugins/replayssm_common.cuh kMaxStages
PERSISTENT_OVERRIDE: tuple[int, int] | None = None
FOLD_BUFFER_ENABLED = True  # False: flush tiles load their ring inputs themselves (for sweeps)


def persistent_ctas_per_sm() -> int:
    """CTAs per SM of the persistent replay kernels (the override's, else PERSISTENT_CTAS_PER_SM)."""
    return (PERSISTENT_OVERRIDE or (PERSISTENT_CTAS_PER_SM, 0))[0]


def stages_for(stage_bytes: int, ctas_per_sm: int | None = None, reserved: int = 0) -> int:
    """Shared-memory stages of ``stage_bytes`` per CTA at ``ctas_per_sm`` (default: the plan's), ``reserved`` bytes
    of the CTA's share set aside (the fold buffer)."""
    ctas = ctas_per_sm or persistent_ctas_per_sm()
    return min(MAX_STAGES, (SHARED_BYTES_PER_SM // ctas - 2048 - reserved) // stage_bytes)  # + static smem


# A fold buffer that costs a stage is still taken while this many stages remain (``fold_first`` plans: KDA, whose
# per-value-head ring keys a flush tile would otherwise load itself; Kimi-Linear fp32 batch 256 on the H200: 3 stages
# + buffer 167.7 us, 4 stages without 176.5 us, benchmarks/results/dev/sweep-31-kda-predecayed-plans.log).
FOLD_FIRST_MIN_STAGES = 3


def persistent_plan(stage_bytes: int, num_tiles: int, device: torch.device,
                    fold_bytes: int = 0, fold_first: bool = False) -> tuple[int, int, int]:
    """(grid size, stages, fold buffer bytes) of a persistent replay kernel streaming ``num_tiles`` stages of
    ``stage_bytes``. The fold buffer (``fold_bytes``: a flush tile's ring inputs) is kept where it costs no stage, or,
    ``fold_first``, while FOLD_FIRST_MIN_STAGES stages remain."""
    ctas_per_sm, stages = persistent_ctas_per_sm(), (PERSISTENT_OVERRIDE or (0, 0))[1]
    if not stages:
        stages = stages_for(stage_bytes, ctas_per_sm)
        if fold_first and FOLD_BUFFER_ENABLED and fold_bytes:
            with_fold = stages_for(stage_bytes, ctas_per_sm, fold_bytes)
            stages = with_fold if with_fold >= FOLD_FIRST_MIN_STAGES else stages
    if not 2 <= stages <= MAX_STAGES:
        raise ValueError(f"state tile of {stage_bytes} bytes: {stages} shared-memory stages (need 2..{MAX_STAGES})")
    fits = stages_for(stage_bytes, ctas_per_sm, fold_bytes) >= stages
    fold = fold_bytes if fits and FOLD_BUFFER_ENABLED else 0
    index = device.index if device.index is not None else torch.cuda.current_device()
    return min(num_tiles, ctas_per_sm * sm_count(index)), stages, fold


def fitting_tiles(stage_of: dict[int, int], tile: int, act_elem: int, ctas_per_sm: int) -> list[int]:
    """The row tiles of ``stage_of`` (tile -> stage bytes) up to ``tile`` whose rows move by 4-byte copies and whose
    stage fits at least twice per CTA of a persistent replay kernel."""
    return [t for t, stage in stage_of.items()
            if t <= tile and t * act_elem % 4 == 0 and stages_for(stage, ctas_per_sm) >= 2]


def tail_start(num_tiles: int, grid: int, fraction: float | None) -> int:
    """First tile a persistent replay kernel claims at run time rather than takes round-robin
    (plugins/replayssm_common.cuh produce_tiles_claiming_tail): ``num_tiles`` (none) for fraction None, else the
    round-robin share of ``num_tiles * (1 - fraction)`` tiles rounded down to whole waves of ``grid`` tiles, at least
    one wave."""
    if fraction is None:
        return num_tiles
    return min(num_tiles, max(1, int(num_tiles * (1.0 - fraction)) // grid) * grid)


def step_rows(step: torch.Tensor | None) -> int:
    """Address of the per-row words of a cache's ``step`` scratch (0 without one): ``step[1:]``; ``step[0]`` is the
    persistent main kernel's tile-claim counter, which the kernels address as ``step[-1]`` of the rows."""
    return 0 if step is None else step.data_ptr() + step.element_size()


# Prep kernels launch as programmatic dependents of the kernel before them on the stream (rssm::prep_begin waits for
# it first), so their launch overlaps that grid's completion: 0.1-0.5 us per step at batch 256 on the H200
# (docs/benchmarks.md, session 13). A kernel before it that triggers its dependents early gets our prep CTAs waiting
# beside it (our own main kernels measured ~30% slower that way); TRTLLM_REPLAYSSM_PREP_PDL=0 launches prep plainly.
# False: plain launches (for A/B sweeps).
PREP_PROGRAMMATIC = True


def prep_programmatic() -> bool:
    """Whether prep kernels launch as programmatic dependents: ``TRTLLM_REPLAYSSM_PREP_PDL`` (0 or 1), else
    PREP_PROGRAMMATIC."""
    env = os.environ.get("TRTLLM_REPLAYSSM_PREP_PDL")
    if env is None:
        return PREP_PROGRAMMATIC
    if env not in ("0", "1"):
        raise ValueError(f"TRTLLM_REPLAYSSM_PREP_PDL: expected 0 or 1, got {env!r}")
    return env == "1"


def launch_prep(function, grid: tuple[int, int, int], block: tuple[int, int, int], params: ctypes.Structure) -> None:
    """Launch a replay prep kernel (see prep_programmatic)."""
    launch(function, grid, block, params, programmatic=prep_programmatic())


def launch_persistent(function, params: ctypes.Structure, num_tiles: int, device: torch.device,
                      fold_bytes: int, tail_fraction: float | None, fold_first: bool = False) -> None:
    """Launch a persistent replay main kernel (programmatic dependent of the prep kernel): sets ``params.stages``,
    ``params.fold_bytes`` and ``params.tail_start`` (``tail_fraction`` of the tiles claimed at run time, see
    tail_start) from the plan for ``params.stage_bytes`` and sizes its dynamic shared memory."""
    grid, params.stages, params.fold_bytes = persistent_plan(params.stage_bytes, num_tiles, device, fold_bytes,
                                                             fold_first)
    params.tail_start = tail_start(num_tiles, grid, tail_fraction)
    shared = params.stages * params.stage_bytes + params.fold_bytes
    allow_dynamic_shared(function, shared)
    launch(function, (grid, 1, 1), (32 * (NUM_WARPS + 1), 1, 1), params, shared_bytes=shared, programmatic=True)


def replay_capable(device: torch.device) -> bool:
    """Whether the GPU runs the persistent replay kernels (sm_90+: bulk async copies, mbarrier waits)."""
    return _compute_major(device.index if device.index is not None else torch.cuda.current_device()) >= 9


@functools.lru_cache(maxsize=None)
def _compute_major(device_index: int) -> int:
    return torch.cuda.get_device_capability(device_index)[0]


def require_persistent_arch(device: torch.device, what: str) -> None:
    """The persistent replay kernels use sm_90 bulk copies; older GPUs run the flush path (mode='auto'/'flush')."""
    if not replay_capable(device):
        raise RuntimeError(f"{what}: mode='replay' needs an sm_90+ GPU (bulk async copies); use mode='auto' or 'flush'")


def ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def stride(t: torch.Tensor | None, dim: int) -> int:
    return 0 if t is None else t.stride(dim)


def make_struct(name: str, fields: list[tuple[str, type]]) -> type[ctypes.Structure]:
    """A ctypes mirror of a kernel's by-value parameter struct (natural alignment, as in the C++ struct)."""
    return type(name, (ctypes.Structure,), {"_fields_": fields})
