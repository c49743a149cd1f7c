"""Kernel configurations: one NVRTC compilation of a plugin source with compile-time shape and dtype constants."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

import torch

# C++ type names of the dtypes kernels take for states and activations.
CUDA_TYPE: dict[torch.dtype, str] = {torch.float32: "float", torch.float16: "__half", torch.bfloat16: "__nv_bfloat16"}
DTYPE_TAG: dict[torch.dtype, str] = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16"}
DTYPE_BY_NAME: dict[str, torch.dtype] = {
    "fp32": torch.float32, "float32": torch.float32, "f32": torch.float32,
    "fp16": torch.float16, "float16": torch.float16, "f16": torch.float16, "half": torch.float16,
    "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
}
NUM_WARPS = 4  # threads per CTA = 32 * NUM_WARPS for every decode kernel


def dtype_from_name(name: str | torch.dtype, arg: str = "dtype") -> torch.dtype:
    """Map 'fp32'/'bf16'/... (or a torch dtype) to a torch dtype; ValueError naming ``arg`` otherwise."""
    if isinstance(name, torch.dtype):
        if name in CUDA_TYPE:
            return name
        raise ValueError(f"{arg}: unsupported dtype {name}; expected one of fp32, fp16, bf16")
    try:
        return DTYPE_BY_NAME[name.lower()]
    except KeyError:
        raise ValueError(f"{arg}: unknown dtype {name!r}; expected one of fp32, fp16, bf16") from None


@dataclass(frozen=True)
class KernelConfig:
    """One compilation unit: ``source`` (file in plugins/) with ``defines``; ``kernels`` are its entry points."""

    family: str
    source: str
    kernels: tuple[str, ...]
    params: tuple[tuple[str, Any], ...] = field(default=())

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


def _tag(params: tuple[tuple[str, Any], ...], key: str) -> str:
    value = dict(params).get(key)
    for dtype, cuda_name in CUDA_TYPE.items():
        if cuda_name == value:
            return DTYPE_TAG[dtype]
    return "na"


def rows_per_cta_choices(rows: int) -> list[int]:
    """Row-tile sizes a kernel may use: multiples of NUM_WARPS that divide ``rows``."""
    return [t for t in range(NUM_WARPS, rows + 1, NUM_WARPS) if rows % t == 0]


def mamba2_config(head_dim: int, d_state: int, state_dtype: torch.dtype, act_dtype: torch.dtype,
                  rows_per_cta: int) -> KernelConfig:
    """The Mamba-2 decode module (baseline + replay kernels) for one shape/dtype/tile."""
    return KernelConfig(
        family="mamba2",
        source="mamba2_decode.cu",
        kernels=("mamba2_state_update_kernel", "mamba2_replay_decode_kernel"),
        params=(("p", head_dim), ("n", d_state), ("pt", rows_per_cta),
                ("state_t", CUDA_TYPE[state_dtype]), ("act_t", CUDA_TYPE[act_dtype])),
    )


def default_rows_per_cta(rows: int, ctas_per_row_budget: int) -> int:
    """Largest row tile that still gives each (row, head) at least ``ctas_per_row_budget`` CTAs (>= 1)."""
    choices = rows_per_cta_choices(rows)
    target = max(1, rows // max(1, ctas_per_row_budget))
    fitting = [t for t in choices if t <= target]
    return max(fitting) if fitting else min(choices)


def unique(configs: Iterable[KernelConfig]) -> list[KernelConfig]:
    """Configs without duplicates, order kept."""
    return list(dict.fromkeys(configs))
