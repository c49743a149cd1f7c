"""Launch plans as values: what a caller may tune (:class:`Tuning`), what one op call launches (:class:`LaunchPlan`),
and the planner steps the families share (mode choice, row tile, persistent-kernel stages, tail claims).

Planners take the GPU as a :class:`Device` value (SM count, compute capability), so plans are computed and tested
without a GPU. Each op module has ``replay_plan`` / ``state_update_plan``; its op runs exactly the plan it is given
(default: the planner's), so a benchmark records what ran.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import functools
import os
from dataclasses import asdict, dataclass, replace

import torch

from trtllm_replayssm.core.formats import StateSpec
from trtllm_replayssm.core.jit.configs import rows_per_cta_choices, tile_choices
from trtllm_replayssm.core.limits import MAX_STAGES, MODES

if TYPE_CHECKING:
    from trtllm_replayssm.core.crossovers import Crossover

PLAN_MODES = ("replay", "flush", "baseline", "grid", "fused")  # what a plan runs
SHARED_BYTES_PER_SM = 228 * 1024  # sm_90 / sm_100; 1 KiB of it reserved per CTA
STATIC_SHARED_BYTES = 2048        # per CTA: the pipe's barriers and the kernels' static shared memory, rounded up
TARGET_CTAS_PER_SM = 24           # speculative state kernels: enough CTAs to fill the GPU at small batch
DECODE_MIN_CTAS_PER_SM = 1        # decode state kernels: the largest tile that still gives every SM a CTA (measured)
L2_HINT_MAX_CTAS_PER_SM = 2       # programmatic state kernels hint L2 before their wait on grids up to this (measured)
# A Mamba-2 verify runs in one launch up to this many work items (batch x heads) per SM: with its own row tiles
# faster than prep + grid up to 3.9 (Super batch 4), slower at 5.8 and 7.8 (H100, docs/decisions.md, Mamba-2 verify
# in one launch).
ONE_LAUNCH_VERIFY_MAX_WORK_PER_SM = 4
FUSED_MAX_ROWS_PER_CTA = 64       # one-launch replay: no larger row tile (measured)
FUSED_STREAM_MAX_HEADS = 16       # streaming one-launch replay: heads per CTA (mamba2_decode.cu kStreamMaxHeads)
FUSED_STREAM_STAGES = 2           # its shared-memory stages unless the tuning says
FOLD_FIRST_MIN_STAGES = 3         # a fold buffer that costs a stage is kept while this many stages remain
PLAIN_REPLAY_CTAS = 3             # replay main kernels on plain checkpoints: CTAs per SM (kReplayCtasPerSm)
PREP_PDL_ENV = "TRTLLM_REPLAYSSM_PREP_PDL"
ADAPTIVE_THRESHOLD_ENV = "TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD"
DEFAULT = "default"  # Tuning.tail_fraction: the family's own choice


@dataclass(frozen=True)
class Device:
    """What the planners need to know of a GPU (``sm_count`` 0: a CPU, where the reference ops run)."""

    sm_count: int
    major: int = 9
    minor: int = 0

    @property
    def arch(self) -> str:
        """``sm_XY`` (the crossover table's key)."""
        return f"sm_{self.major}{self.minor}"

    @property
    def is_cuda(self) -> bool:
        return self.sm_count > 0

    @property
    def replay_capable(self) -> bool:
        """The persistent replay kernels use sm_90 bulk copies and mbarrier waits."""
        return self.major >= 9


CPU = Device(0, 0)


@functools.lru_cache(maxsize=None)
def _cuda_device(index: int) -> Device:
    props = torch.cuda.get_device_properties(index)
    return Device(props.multi_processor_count, props.major, props.minor)


def device_of(device: torch.device) -> Device:
    """The Device of a torch device (CPU for CPU tensors)."""
    if device.type != "cuda":
        return CPU
    return _cuda_device(device.index if device.index is not None else torch.cuda.current_device())


@dataclass(frozen=True)
class Tuning:
    """The planner's knobs; the defaults are the shipped plans. Benchmark sweeps and tests pass their own.

    ``rows_per_cta``: the row tile (None: the heuristic); ``ctas_per_sm`` and ``stages``: the persistent replay
    kernels' CTAs per SM and shared-memory stages (None: as many as fit); ``stored_ctas_per_sm``: the replay main
    kernel's CTAs per SM on a stored checkpoint (None: the family's); ``tail_fraction``: the share of the
    persistent kernels' tiles claimed at run time (None: all round-robin; DEFAULT: the family's);
    ``fold_buffer``: keep a flush tile's ring inputs in shared memory where it fits; ``flush_apart``: the persistent
    replay kernel leaves flush rows to a flush-rows kernel launched after it on ``flush_ctas_per_sm`` CTAs per SM
    (a stored checkpoint's always, a plain one's where True; False refused for a stored checkpoint);
    ``flush_rows_per_cta``: the row tile of the GDN/KDA module whose flush-rows kernel runs (None: the main kernel's);
    ``programmatic_prep``: launch the prep kernels as programmatic dependents (None: $TRTLLM_REPLAYSSM_PREP_PDL,
    default on); ``programmatic_state``: launch the state kernels (baseline, flush, one-launch replay) as programmatic
    dependents; ``l2_hints``: let them hint L2 before their wait (None: state_l2_hints decides by grid size);
    ``adaptive_threshold``: work items (batch x heads) below which ``mode='auto'`` flushes every step and a Mamba-2
    speculative verify runs its grid kernel (None: $TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD, else the op's work per SM x
    SMs); ``one_launch_verify_max_work_per_sm``: a Mamba-2 speculative verify of at most this many work items per SM
    runs in one launch (its grid kernel taking the prep kernel's work itself; 0: never); ``fused_heads_per_cta``: the
    Mamba-2 one-launch replay streams this many consecutive heads of a group per CTA through ``stages`` (default
    FUSED_STREAM_STAGES) shared-memory stages of one head's checkpoint (plain checkpoints; None: a CTA per row tile)."""

    rows_per_cta: int | None = None
    ctas_per_sm: int = 3
    stored_ctas_per_sm: int | None = None
    stages: int | None = None
    tail_fraction: float | None | str = DEFAULT
    fold_buffer: bool = True
    flush_apart: bool | None = None
    flush_ctas_per_sm: int = 8
    flush_rows_per_cta: int | None = None
    programmatic_prep: bool | None = None
    programmatic_state: bool = True
    l2_hints: bool | None = None
    adaptive_threshold: int | None = None
    one_launch_verify_max_work_per_sm: float = ONE_LAUNCH_VERIFY_MAX_WORK_PER_SM
    fused_heads_per_cta: int | None = None

    def __post_init__(self) -> None:
        heads = self.fused_heads_per_cta
        if heads is not None and not 1 <= heads <= FUSED_STREAM_MAX_HEADS:
            raise ValueError(f"fused_heads_per_cta: expected None or 1..{FUSED_STREAM_MAX_HEADS}, got {heads!r}")
        if self.ctas_per_sm < 1:
            raise ValueError(f"ctas_per_sm: expected >= 1, got {self.ctas_per_sm}")
        if self.stored_ctas_per_sm is not None and self.stored_ctas_per_sm < 1:
            raise ValueError(f"stored_ctas_per_sm: expected >= 1, got {self.stored_ctas_per_sm}")
        if not self.one_launch_verify_max_work_per_sm >= 0:
            raise ValueError(f"one_launch_verify_max_work_per_sm: expected a number >= 0, "
                             f"got {self.one_launch_verify_max_work_per_sm!r}")
        if self.flush_ctas_per_sm < 1:
            raise ValueError(f"flush_ctas_per_sm: expected >= 1, got {self.flush_ctas_per_sm}")
        if self.flush_rows_per_cta is not None and self.flush_rows_per_cta < 1:
            raise ValueError(f"flush_rows_per_cta: expected None or >= 1, got {self.flush_rows_per_cta}")
        if self.stages is not None and not 2 <= self.stages <= MAX_STAGES:
            raise ValueError(f"stages: expected 2..{MAX_STAGES}, got {self.stages}")
        frac = self.tail_fraction
        if frac not in (None, DEFAULT) and not (isinstance(frac, float) and 0.0 <= frac <= 1.0):
            raise ValueError(f"tail_fraction: expected None, {DEFAULT!r} or a float in [0, 1], got {frac!r}")


@dataclass(frozen=True)
class LaunchPlan:
    """What one op call launches. ``mode``: ``replay`` (prep + persistent main kernel), ``fused`` (the replay in one
    launch of a state-kernel grid: every CTA folds its rows' ring, ``fold_bytes`` of shared memory; with ``stages``
    the streaming form: grid (heads / k, 1, batch), each CTA k heads through ``stages`` stages of one head's checkpoint
    of ``stage_bytes``, then ``fold_bytes`` of the heads' ring records), ``flush`` (the
    flush kernel: every row folds its ring and writes its state), ``baseline`` (the state-update kernel) or ``grid`` (a
    speculative verify at small batch: prep where the plan has one, then a CTA per row tile). ``key`` names the shapes and dtypes the plan was
    made for; an op refuses a plan made for others.

    State kernels (fused, flush, baseline) run ``grid`` = (rows / rows_per_cta, heads, batch). The replay's prep kernel runs
    ``prep_grid`` x ``prep_threads``; its main kernel ``grid`` = (CTAs, 1, 1) with ``stages`` stages of
    ``stage_bytes``, a fold buffer of ``fold_bytes`` and tiles from ``tail_start`` on claimed at run time; with
    ``flush_ctas`` > 0 the main kernel skips flush rows and the flush-rows kernel folds them on that many CTAs, with
    ``flush_bytes`` of dynamic shared memory (GDN/KDA: an item's staged ring), from the module of row tile
    ``flush_rows_per_cta`` (GDN/KDA; 0: the main kernel's). With
    ``programmatic`` the state kernels launch as programmatic dependents of the kernel before them
    (rssm::wait_previous_grid), and with ``l2_hints`` they ask L2 for their slot's lines before that wait."""

    mode: str
    key: tuple
    rows_per_cta: int
    grid: tuple[int, int, int]
    stages: int = 0
    stage_bytes: int = 0
    fold_bytes: int = 0
    tail_start: int = 0
    prep_grid: tuple[int, int, int] = (0, 0, 0)
    prep_threads: int = 0
    programmatic_prep: bool = False
    tail_fraction: float | None = None
    num_tiles: int = 0
    flush_ctas: int = 0
    flush_bytes: int = 0
    flush_rows_per_cta: int = 0
    programmatic: bool = False
    l2_hints: bool = False

    def __post_init__(self) -> None:
        if self.mode not in PLAN_MODES:
            raise ValueError(f"mode: expected one of {PLAN_MODES}, got {self.mode!r}")

    @property
    def words(self) -> list[int]:
        """The launch numbers as the custom ops take them (``int[]``; :meth:`Launch.from_words` reads them)."""
        return [PLAN_MODES.index(self.mode), self.rows_per_cta, *self.grid, self.stages, self.stage_bytes,
                self.fold_bytes, self.tail_start, *self.prep_grid, self.prep_threads, int(self.programmatic_prep),
                self.flush_ctas, self.flush_bytes, self.flush_rows_per_cta, int(self.programmatic), int(self.l2_hints)]

    def record(self) -> dict:
        """The plan's numbers for a results record (without the key)."""
        out = asdict(self)
        out.pop("key")
        return out


@dataclass(frozen=True)
class Launch:
    """The launch numbers of a LaunchPlan, read back from its ``words`` inside a custom op."""

    mode: str
    rows_per_cta: int
    grid: tuple[int, int, int]
    stages: int
    stage_bytes: int
    fold_bytes: int
    tail_start: int
    prep_grid: tuple[int, int, int]
    prep_threads: int
    programmatic_prep: bool
    flush_ctas: int
    flush_bytes: int
    flush_rows_per_cta: int
    programmatic: bool
    l2_hints: bool

    @classmethod
    def from_words(cls, words: list[int]) -> "Launch":
        w = list(words)
        if len(w) != 19:
            raise ValueError(f"plan: expected 19 words (LaunchPlan.words), got {len(w)}")
        return cls(PLAN_MODES[w[0]], w[1], tuple(w[2:5]), w[5], w[6], w[7], w[8], tuple(w[9:12]), w[12],
                   bool(w[13]), w[14], w[15], w[16], bool(w[17]), bool(w[18]))

    @property
    def shared_bytes(self) -> int:
        """Dynamic shared memory of the plan's state kernel: its stages and fold buffer (the persistent main kernel)
        or records (the one-launch replays)."""
        return self.stages * self.stage_bytes + self.fold_bytes


# ---------------------------------------------------------------------------------------------- shared steps
def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    return mode


def resolve_mode(mode: str, work_items: int, replay_state: bool, per_sm: int, device: Device,
                 tuning: Tuning, fused_per_sm: float | None = None) -> str:
    """What a requested mode runs (``replay``, ``fused`` or ``flush``): ``auto`` replays on a replay-capable GPU
    where the state dtype's replay is measured faster (``replay_state``) and the batch fills the GPU (``work_items``
    at least the adaptive threshold, ``per_sm`` x SMs by default); below it, the one-launch replay from
    ``fused_per_sm`` x SMs work items (None: never), else the flush kernel. On a CPU ``auto`` and ``fused`` mean
    ``replay`` (the reference replay step, which ``fused`` equals)."""
    check_mode(mode)
    if not device.is_cuda:
        return "replay" if mode in ("auto", "fused") else mode
    if mode != "auto":
        return mode
    if not replay_state or not device.replay_capable:
        return "flush"
    if work_items >= adaptive_threshold(per_sm, device, tuning):
        return "replay"
    return "fused" if fused_per_sm is not None and work_items >= fused_per_sm * device.sm_count else "flush"


def non_replay_plan(op: str, mode: str, key: tuple, work_items: int, replay_state: bool, crossover: "Crossover",
                    device: Device, tuning: Tuning, flush_plan: Callable[[], "LaunchPlan"],
                    fused_plan: Callable[[], "LaunchPlan"]) -> "LaunchPlan | None":
    """The plan of a replay op's call that launches no persistent replay kernels: on a CPU (the reference step of the
    resolved mode), the flush kernel (``flush_plan()``) or the one-launch replay (``fused_plan()``); None when the
    replay kernels run. ``crossover``: the op's entry of the crossover table (resolve_mode takes its two bounds).
    ``mode='replay'`` on a GPU without bulk async copies is a RuntimeError naming ``op``."""
    resolved = resolve_mode(mode, work_items, replay_state, crossover.min_work_per_sm, device, tuning,
                            crossover.fused_min_work_per_sm)
    if not device.is_cuda:
        return LaunchPlan(resolved, key, 0, (0, 0, 0))
    if resolved == "flush":
        return flush_plan()
    if resolved == "fused":
        return fused_plan()
    if not device.replay_capable:
        raise RuntimeError(f"{op}: mode='replay' needs an sm_90+ GPU (bulk async copies); use mode='auto' or 'flush'")
    return None


def adaptive_threshold(per_sm: int, device: Device, tuning: Tuning) -> int:
    """Work items below which ``auto`` flushes: the tuning's, else $TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD, else
    ``per_sm`` x SMs."""
    if tuning.adaptive_threshold is not None:
        return tuning.adaptive_threshold
    env = os.environ.get(ADAPTIVE_THRESHOLD_ENV)
    return int(env) if env is not None else per_sm * device.sm_count


def programmatic_prep(tuning: Tuning) -> bool:
    """Whether prep kernels launch as programmatic dependents: the tuning's, else $TRTLLM_REPLAYSSM_PREP_PDL (0 or
    1), else on."""
    if tuning.programmatic_prep is not None:
        return tuning.programmatic_prep
    env = os.environ.get(PREP_PDL_ENV)
    if env is None:
        return True
    if env not in ("0", "1"):
        raise ValueError(f"{PREP_PDL_ENV}: expected 0 or 1, got {env!r}")
    return env == "1"


def state_l2_hints(grid: tuple[int, int, int], device: Device, tuning: Tuning, any_grid: bool = False) -> bool:
    """Whether a programmatic state kernel of ``grid`` hints L2 before its wait: the tuning's, else on grids of at
    most L2_HINT_MAX_CTAS_PER_SM CTAs per SM (``any_grid``: on every grid; docs/decisions.md, programmatic state
    kernels). Never for plainly launched kernels."""
    if not tuning.programmatic_state:
        return False
    if tuning.l2_hints is not None:
        return tuning.l2_hints
    return any_grid or grid[0] * grid[1] * grid[2] <= L2_HINT_MAX_CTAS_PER_SM * device.sm_count


def state_tile(rows: int, cols: int, work_items: int, device: Device, tuning: Tuning, max_rows: int | None = None,
               min_ctas_per_sm: float = TARGET_CTAS_PER_SM) -> int:
    """Row tile of a state kernel for a (rows x cols) state per head (the tuning's ``rows_per_cta`` if set): the
    largest tile up to ``max_rows`` (the one-launch replay: FUSED_MAX_ROWS_PER_CTA) whose grid has
    ``min_ctas_per_sm`` CTAs per SM (the decode state kernels: DECODE_MIN_CTAS_PER_SM), else the smallest."""
    if tuning.rows_per_cta is not None:
        if tuning.rows_per_cta not in rows_per_cta_choices(rows):
            raise ValueError(f"rows_per_cta: expected one of {rows_per_cta_choices(rows)}, got {tuning.rows_per_cta}")
        return tuning.rows_per_cta
    choices = tile_choices(rows, cols)
    if max_rows is not None:
        choices = [t for t in choices if t <= max_rows] or [min(choices)]
    fitting = [t for t in choices if work_items * (rows // t) >= min_ctas_per_sm * device.sm_count]
    return max(fitting) if fitting else min(choices)


def stages_for(stage_bytes: int, ctas_per_sm: int, reserved: int = 0) -> int:
    """Shared-memory stages of ``stage_bytes`` per CTA at ``ctas_per_sm``, ``reserved`` bytes set aside."""
    return min(MAX_STAGES, (SHARED_BYTES_PER_SM // ctas_per_sm - STATIC_SHARED_BYTES - reserved) // stage_bytes)


def fitting_tiles(stage_of: dict[int, int], tile: int, act_elem: int, ctas_per_sm: int) -> list[int]:
    """The row tiles of ``stage_of`` (tile -> stage bytes) up to ``tile`` whose rows move by 4-byte copies and whose
    stage fits at least twice per CTA of a persistent replay kernel."""
    return [t for t, stage in stage_of.items()
            if t <= tile and t * act_elem % 4 == 0 and stages_for(stage, ctas_per_sm) >= 2]


def tail_start(num_tiles: int, grid: int, fraction: float | None) -> int:
    """First tile a persistent replay kernel claims at run time rather than takes round-robin: ``num_tiles`` (none)
    for fraction None, else the round-robin share of ``num_tiles * (1 - fraction)`` tiles rounded down to whole
    waves of ``grid`` tiles, at least one wave."""
    if fraction is None:
        return num_tiles
    return min(num_tiles, max(1, int(num_tiles * (1.0 - fraction)) // grid) * grid)


@dataclass(frozen=True)
class Persistent:
    """The persistent main kernel's part of a replay plan."""

    grid: int
    stages: int
    stage_bytes: int
    fold_bytes: int
    tail_start: int
    tail_fraction: float | None


def flush_rows_apart(tuning: Tuning, stored: bool) -> bool:
    """Whether a replay's persistent kernel leaves flush rows to the flush-rows kernel: always for a stored checkpoint
    (its main kernel never folds), for a plain one where the tuning says so (docs/decisions.md, flush rows apart)."""
    if stored:
        if tuning.flush_apart is False:
            raise ValueError("flush_apart: False is for plain checkpoints; a stored checkpoint's flush rows always go "
                             "to the flush-rows kernel")
        return True
    return bool(tuning.flush_apart)


def flush_ctas(items: int, apart: bool, device: Device, tuning: Tuning) -> int:
    """CTAs of the flush-rows kernel over ``items`` (row, head or row tile) items: the tuning's per SM, at most one
    per item; 0 where flush rows stay in the persistent kernel."""
    return min(items, tuning.flush_ctas_per_sm * device.sm_count) if apart else 0


def replay_tuning(spec: StateSpec, tuning: Tuning, stored_default: int, stored_bound: int) -> Tuning:
    """``tuning`` with the replay main kernel's CTAs per SM (``ctas_per_sm``) for a ``spec`` checkpoint: for a plain
    one the tuning's ``ctas_per_sm``, for a stored one its ``stored_ctas_per_sm`` (None: the family's
    ``stored_default``), each at most the kernel's launch bounds (kReplayCtasPerSm): PLAIN_REPLAY_CTAS, or the
    family's ``stored_bound`` (a stored checkpoint's main kernel never folds and needs fewer registers)."""
    if spec.stored:
        ctas = stored_default if tuning.stored_ctas_per_sm is None else tuning.stored_ctas_per_sm
        return replace(tuning, ctas_per_sm=min(ctas, stored_bound))
    return replace(tuning, ctas_per_sm=min(tuning.ctas_per_sm, PLAIN_REPLAY_CTAS))


def persistent_plan(stage_bytes: int, num_tiles: int, fold_bytes: int, fold_first: bool,
                    tail_fraction: float | None, device: Device, tuning: Tuning) -> Persistent:
    """Grid, stages and fold buffer of a persistent replay kernel streaming ``num_tiles`` stages of ``stage_bytes``:
    the fold buffer (``fold_bytes``) is kept where it costs no stage, or, ``fold_first``, while
    FOLD_FIRST_MIN_STAGES stages remain."""
    ctas = tuning.ctas_per_sm
    stages = tuning.stages
    if stages is None:
        while ctas > 1 and stages_for(stage_bytes, ctas) < 2:  # fewer CTAs where the tuning's leave < 2 stages each
            ctas -= 1
        stages = stages_for(stage_bytes, ctas)
        if fold_first and tuning.fold_buffer and fold_bytes:
            with_fold = stages_for(stage_bytes, ctas, fold_bytes)
            stages = with_fold if with_fold >= FOLD_FIRST_MIN_STAGES else stages
    if not 2 <= stages <= MAX_STAGES:
        raise ValueError(f"state tile of {stage_bytes} bytes: {stages} shared-memory stages (need 2..{MAX_STAGES})")
    fits = stages_for(stage_bytes, ctas, fold_bytes) >= stages
    fold = fold_bytes if fits and tuning.fold_buffer else 0
    grid = min(num_tiles, ctas * device.sm_count)
    return Persistent(grid, stages, stage_bytes, fold, tail_start(num_tiles, grid, tail_fraction), tail_fraction)


def persistent_verify_plan(key: tuple, stage_of: dict[int, int], tile: int, rows: int, act_elem: int,
                           fold_bytes: int, tail_fraction: float | None, device: Device, tuning: Tuning,
                           **prep) -> LaunchPlan:
    """A persistent verify kernel's plan (mode ``replay``, after its prep kernel ``prep``) over ``rows`` state rows:
    with the tuning's row tile, else the largest tile of ``stage_of`` (tile -> stage bytes) up to the heuristic's
    ``tile`` whose stage fits twice per CTA beside the always-kept fold buffer (``fold_bytes``); as many stages as
    fit (the tuning's, if set)."""
    ctas = tuning.ctas_per_sm
    if tuning.rows_per_cta is None:
        fits = [t for t in fitting_tiles(stage_of, tile, act_elem, ctas) if stages_for(stage_of[t], ctas, fold_bytes) >= 2]
        tile = max(fits) if fits else min(stage_of)
    stage = stage_of[tile]
    stages = tuning.stages or stages_for(stage, ctas, fold_bytes)
    if not 2 <= stages <= MAX_STAGES or stages_for(stage, ctas, fold_bytes) < stages:
        raise ValueError(f"rows_per_cta: a verify tile of {tile} rows ({stage}-byte stages) does not fit "
                         f"{max(stages, 2)} stages{' and the fold buffer' if fold_bytes else ''} at {ctas} CTAs per SM")
    num_tiles = rows // tile
    grid = min(num_tiles, ctas * device.sm_count)
    return LaunchPlan("replay", key, tile, (grid, 1, 1), stages, stage, fold_bytes,
                      tail_start(num_tiles, grid, tail_fraction), tail_fraction=tail_fraction, num_tiles=num_tiles,
                      **prep)


def resolved_tail_fraction(tuning: Tuning, family_default: float | None) -> float | None:
    return family_default if tuning.tail_fraction == DEFAULT else tuning.tail_fraction


def checked_plan(plan: LaunchPlan, key: tuple, mode: str = "auto") -> LaunchPlan:
    """``plan`` if it was made for a call of ``key`` (shapes, dtypes, batch) and agrees with an explicit ``mode``;
    ValueError naming what differs otherwise."""
    if not isinstance(plan, LaunchPlan):
        raise TypeError(f"plan: expected a LaunchPlan, got {type(plan).__name__}")
    if plan.key != key:
        raise ValueError(f"plan: made for {plan.key}, but this call is {key}; make it with the op's planner")
    if check_mode(mode) != "auto" and mode != plan.mode:
        raise ValueError(f"mode: {mode!r} disagrees with the plan's mode {plan.mode!r}")
    return plan
