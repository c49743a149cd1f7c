"""Where ``mode="auto"`` switches kernels: a table of measured crossovers (work items per SM) per family, state spec,
GPU arch and launch of the state kernels, read from ``crossovers.json`` beside this module and written by
``benchmarks/dev/crossover_sweep.py``. Below an entry's ``min_work_per_sm`` ``auto`` runs the flush kernel, or the
one-launch replay (``fused``) from the entry's ``fused_min_work_per_sm`` where one is given; from ``min_work_per_sm``
on, the replay kernels. The most specific entry wins (an exact arch over ``*`` first, then an exact state label, then
an exact launch: ``programmatic`` dependents of the kernel before, or ``plain`` as the TensorRT-LLM module launches
them); without one the planners use DEFAULT_MIN_WORK_PER_SM and no fused band."""
from __future__ import annotations

import functools
import json
from dataclasses import dataclass
from pathlib import Path

TABLE = Path(__file__).with_name("crossovers.json")
DEFAULT_MIN_WORK_PER_SM = 8  # the H200 fp32 crossover of every family (docs/decisions.md, adaptive mode)
FAMILIES = ("mamba2", "gdn", "kda")
LAUNCHES = ("programmatic", "plain")


@dataclass(frozen=True)
class Crossover:
    """One table entry: ``family``, ``state`` (a StateSpec label or ``*``), ``arch`` (``sm_XY`` or ``*``), ``launch``
    (one of LAUNCHES or ``*``)."""

    family: str
    state: str
    arch: str
    min_work_per_sm: int
    source: str = ""
    fused_min_work_per_sm: float | None = None
    launch: str = "*"

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"crossover family: expected one of {FAMILIES}, got {self.family!r}")
        if self.arch != "*" and not self.arch.startswith("sm_"):
            raise ValueError(f"crossover arch: expected 'sm_XY' or '*', got {self.arch!r}")
        if self.launch not in (*LAUNCHES, "*"):
            raise ValueError(f"crossover launch: expected one of {LAUNCHES} or '*', got {self.launch!r}")
        if not isinstance(self.min_work_per_sm, int) or self.min_work_per_sm < 0:
            raise ValueError(f"crossover min_work_per_sm: expected an int >= 0, got {self.min_work_per_sm!r}")
        fused = self.fused_min_work_per_sm
        if fused is not None and (isinstance(fused, bool) or not isinstance(fused, (int, float)) or fused < 0):
            raise ValueError(f"crossover fused_min_work_per_sm: expected a number >= 0 or null, got {fused!r}")

    def specificity(self, state: str, arch: str, launch: str) -> int | None:
        """How closely the entry matches (higher: closer), None if it does not."""
        if self.state not in (state, "*") or self.arch not in (arch, "*") or self.launch not in (launch, "*"):
            return None
        return 4 * (self.arch == arch) + 2 * (self.state == state) + (self.launch == launch)


def parse(table: dict) -> tuple[Crossover, ...]:
    """The entries of a crossover table (the JSON's object); ValueError naming what is wrong."""
    entries = table.get("entries")
    if not isinstance(entries, list):
        raise ValueError("crossover table: expected an 'entries' list")
    return tuple(Crossover(**e) for e in entries)


@functools.lru_cache(maxsize=None)
def shipped() -> tuple[Crossover, ...]:
    """The table that ships with the package."""
    return parse(json.loads(TABLE.read_text()))


def launch_of(programmatic: bool) -> str:
    """The launch label of state kernels launched as programmatic dependents (``Tuning.programmatic_state``) or not."""
    return "programmatic" if programmatic else "plain"


def entry(family: str, state: str, arch: str, table: tuple[Crossover, ...] | None = None,
          launch: str = "programmatic") -> Crossover:
    """The most specific entry for ``family`` with state spec label ``state`` on ``arch`` whose state kernels launch as
    ``launch`` (the default without one)."""
    if launch not in LAUNCHES:
        raise ValueError(f"launch: expected one of {LAUNCHES}, got {launch!r}")
    matches = [(c.specificity(state, arch, launch), c) for c in (shipped() if table is None else table)
               if c.family == family]
    matches = [(s, c) for s, c in matches if s is not None]
    if not matches:
        return Crossover(family, "*", "*", DEFAULT_MIN_WORK_PER_SM)
    return max(matches, key=lambda m: m[0])[1]
