"""Kernel configurations: one NVRTC compilation of a plugin source with compile-time shape and dtype constants."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable

from trtllm_replayssm.core.formats import DTYPES
from trtllm_replayssm.core.limits import NUM_WARPS

# Row tiles above this many fp32 state elements per thread spill registers (measured with -Xptxas -v).
MAX_TILE_ELEMS_PER_THREAD = 80


@dataclass(frozen=True)
class KernelConfig:
    """One compilation unit: ``source`` (file in plugins/) with ``defines``; ``kernels`` are its entry points.

    ``layouts``: the parameter structs the kernels take (core/layouts.py), provided as in-memory headers;
    ``checks(config)``: C++ appended to the source (``static_assert`` lines pinning the buffer sizes the host uses).
    Neither is part of the config's identity.
    """

    family: str
    source: str
    kernels: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = field(default=())
    layouts: tuple = field(default=(), compare=False, hash=False, repr=False)
    checks: Callable[["KernelConfig"], str] | None = field(default=None, compare=False, hash=False, repr=False)

    @property
    def defines(self) -> dict[str, str]:
        return {k.upper(): str(v) for k, v in self.params}

    @property
    def name(self) -> str:
        parts = [self.family] + [f"{k}{v}" for k, v in self.params if k not in ("state_t", "act_t")]
        parts += [f"s{_tag(self.params, 'state_t')}", f"a{_tag(self.params, 'act_t')}"]
        return "_".join(str(p) for p in parts)

    def param(self, key: str) -> Any:
        return dict(self.params)[key]

    def appended_source(self) -> str:
        """The C++ compiled after the source file (empty without checks)."""
        return self.checks(self) if self.checks else ""


def _tag(params: tuple[tuple[str, Any], ...], key: str) -> str:
    value = dict(params).get(key)
    return next((d.tag for d in DTYPES if d.cuda == value), "na")


def rows_per_cta_choices(rows: int) -> list[int]:
    """Row-tile sizes a kernel may use: multiples of NUM_WARPS that divide ``rows``."""
    return [t for t in range(NUM_WARPS, rows + 1, NUM_WARPS) if rows % t == 0]


def tile_choices(rows: int, cols: int) -> list[int]:
    """Row tiles the launch heuristic may pick for a (rows x cols) state: >= 8 rows (>= 2 per warp) where possible
    and no more than MAX_TILE_ELEMS_PER_THREAD state elements per thread."""
    fitting = [t for t in rows_per_cta_choices(rows) if t * cols // (32 * NUM_WARPS) <= MAX_TILE_ELEMS_PER_THREAD]
    return [t for t in fitting if t >= 8] or fitting


def unique(configs: Iterable[KernelConfig]) -> list[KernelConfig]:
    """Configs without duplicates, order kept."""
    return list(dict.fromkeys(configs))
