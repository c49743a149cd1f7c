"""Benchmark geometries (one layer, TP 1) of the models the kernel benchmark covers."""
from __future__ import annotations

from dataclasses import dataclass

from trtllm_replayssm.core.dims import SSMDims
from trtllm_replayssm.core.families import FAMILIES
from trtllm_replayssm.serving.presets import get_preset


@dataclass(frozen=True)
class BenchShape:
    """One benchmarked layer: the model preset it comes from and its SSM dims."""

    model: str
    dims: SSMDims

    @property
    def family(self) -> str:
        return self.dims.family


BENCH_MODELS: tuple[str, ...] = (
    "nemotron-3-nano-4b", "nemotron-3-super-120b",  # Mamba-2
    "qwen3.5-4b", "qwen3.5-122b",                   # GDN
    "kimi-linear-48b", "glm-5.3-flash",             # KDA
)


def shape_from_preset(name: str) -> BenchShape:
    """The recurrent-layer geometry of model preset ``name``."""
    return BenchShape(name, get_preset(name).ssm_dims)


def select_shapes(families: list[str], models: list[str] | None) -> list[BenchShape]:
    """Shapes of the given families, restricted to ``models`` when given (names must exist and match a family)."""
    for fam in families:
        if fam not in FAMILIES:
            raise ValueError(f"families: expected any of {list(FAMILIES)}, got {fam!r}")
    if models:
        unknown = [m for m in models if m not in BENCH_MODELS]
        if unknown:
            raise ValueError(f"models: unknown {unknown}; expected names from {list(BENCH_MODELS)}")
        chosen = [shape_from_preset(m) for m in models]
        outside = [s.model for s in chosen if s.family not in families]
        if outside:
            raise ValueError(f"models: {outside} are not in the selected families {families}")
        return chosen
    return [s for s in map(shape_from_preset, BENCH_MODELS) if s.family in families]
