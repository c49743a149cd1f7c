"""Benchmark geometries (TP-local, one layer) of the models the kernel benchmark covers."""
from __future__ import annotations

from dataclasses import dataclass

FAMILIES: tuple[str, ...] = ("mamba2", "gdn", "kda")


@dataclass(frozen=True)
class BenchShape:
    """One layer's recurrent geometry.

    Mamba-2: ``heads`` = nheads H, ``head_dim`` = P, ``key_dim`` = d_state N, ``key_heads`` = ngroups G.
    GDN / KDA: ``heads`` = value heads HV, ``head_dim`` = V, ``key_dim`` = K, ``key_heads`` = key heads H.
    The state of one sequence is ``heads x head_dim x key_dim`` elements.
    """

    family: str
    model: str
    heads: int
    head_dim: int
    key_dim: int
    key_heads: int

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"family: expected one of {FAMILIES}, got {self.family!r}")
        for name in ("heads", "head_dim", "key_dim", "key_heads"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if self.heads % self.key_heads:
            raise ValueError(f"heads: expected a multiple of key_heads={self.key_heads}, got {self.heads}")

    @property
    def state_elems(self) -> int:
        """Elements of one sequence's state (all heads)."""
        return self.heads * self.head_dim * self.key_dim


BENCH_MODELS: tuple[str, ...] = (
    "nemotron-3-nano-4b", "nemotron-3-super-120b",  # Mamba-2
    "qwen3.5-4b", "qwen3.5-122b",                   # GDN
    "kimi-linear-48b", "glm-5.3-flash",             # KDA
)


def shape_from_preset(name: str) -> BenchShape:
    """The recurrent-layer geometry of model preset `name` (``trtllm_replayssm.serving.presets``)."""
    from trtllm_replayssm.serving.presets import get_preset

    spec = get_preset(name)
    if spec.family == "mamba2":
        d = spec.mamba2
        return BenchShape("mamba2", name, heads=d.nheads, head_dim=d.head_dim, key_dim=d.d_state, key_heads=d.n_groups)
    if spec.family == "gdn":
        d = spec.gdn
        return BenchShape("gdn", name, heads=d.num_v_heads, head_dim=d.head_v_dim, key_dim=d.head_k_dim,
                          key_heads=d.num_k_heads)
    if spec.family == "kda":
        d = spec.kda
        return BenchShape("kda", name, heads=d.num_heads, head_dim=d.head_dim, key_dim=d.head_dim,
                          key_heads=d.num_heads)
    raise ValueError(f"name: preset {name!r} has family {spec.family!r}; expected one of {FAMILIES}")


def select_shapes(families: list[str], models: list[str] | None) -> list[BenchShape]:
    """Shapes of the given families, restricted to `models` when given (names must exist and match a family)."""
    for fam in families:
        if fam not in FAMILIES:
            raise ValueError(f"families: expected any of {FAMILIES}, got {fam!r}")
    if models:
        unknown = [m for m in models if m not in BENCH_MODELS]
        if unknown:
            raise ValueError(f"models: unknown {unknown}; expected names from {list(BENCH_MODELS)}")
        chosen = [shape_from_preset(m) for m in models]
        outside = [s.model for s in chosen if s.family not in families]
        if outside:
            raise ValueError(f"models: {outside} are not in the selected families {families}")
        return chosen
    shapes = [shape_from_preset(m) for m in BENCH_MODELS]
    return [s for s in shapes if s.family in families]
