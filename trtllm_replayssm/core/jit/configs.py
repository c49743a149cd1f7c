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
# Row tiles above this many fp32 state elements per thread spill registers (measured with -Xptxas -v).
MAX_TILE_ELEMS_PER_THREAD = 80


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


def tile_choices(rows: int, cols: int) -> list[int]:
    """Row tiles the launch heuristic may pick for a (rows x cols) state: >= 8 rows (>= 2 per warp) where possible
    and no more than MAX_TILE_ELEMS_PER_THREAD state elements per thread."""
    fitting = [t for t in rows_per_cta_choices(rows) if t * cols // (32 * NUM_WARPS) <= MAX_TILE_ELEMS_PER_THREAD]
    return [t for t in fitting if t >= 8] or fitting


def mamba2_config(head_dim: int, d_state: int, state_dtype: torch.dtype, act_dtype: torch.dtype,
                  rows_per_cta: int) -> KernelConfig:
    """The Mamba-2 decode module (baseline + replay kernels) for one shape/dtype/tile."""
    return KernelConfig(
        family="mamba2",
        source="mamba2_decode.cu",
        kernels=("mamba2_state_update_kernel", "mamba2_flush_decode_kernel", "mamba2_replay_prep_kernel",
                 "mamba2_replay_main_kernel"),
        params=(("p", head_dim), ("n", d_state), ("pt", rows_per_cta),
                ("state_t", CUDA_TYPE[state_dtype]), ("act_t", CUDA_TYPE[act_dtype])),
    )


def _delta_rule_config(family: str, key_dim: int, value_dim: int, state_dtype: torch.dtype, act_dtype: torch.dtype,
                       rows_per_cta: int) -> KernelConfig:
    return KernelConfig(
        family=family,
        source="delta_rule_decode.cu",
        kernels=("delta_state_update_kernel", "delta_flush_decode_kernel", "delta_replay_prep_kernel",
                 "delta_replay_main_kernel"),
        params=(("dk", key_dim), ("dv", value_dim), ("vtile", rows_per_cta), ("kda", int(family == "kda")),
                ("state_t", CUDA_TYPE[state_dtype]), ("act_t", CUDA_TYPE[act_dtype])),
    )


def gdn_config(key_dim: int, value_dim: int, state_dtype: torch.dtype, act_dtype: torch.dtype,
               rows_per_cta: int) -> KernelConfig:
    """The Gated DeltaNet decode module (baseline + replay kernels; one log-gate per value head)."""
    return _delta_rule_config("gdn", key_dim, value_dim, state_dtype, act_dtype, rows_per_cta)


def kda_config(key_dim: int, value_dim: int, state_dtype: torch.dtype, act_dtype: torch.dtype,
               rows_per_cta: int) -> KernelConfig:
    """The Kimi Delta Attention decode module (baseline + replay kernels; one log-gate per key channel)."""
    return _delta_rule_config("kda", key_dim, value_dim, state_dtype, act_dtype, rows_per_cta)


def configs_for_spec(spec, state_dtype: torch.dtype | str, act_dtype: torch.dtype | str = torch.bfloat16,
                     buffer_len: int = 16, tp_size: int = 1) -> list[KernelConfig]:
    """Every kernel module a model preset (``presets.ModelSpec``) can launch at any batch size: all row tiles."""
    state_dtype, act_dtype = dtype_from_name(state_dtype, "state_dtype"), dtype_from_name(act_dtype, "act_dtype")
    dims = spec.ssm_dims
    if spec.family == "mamba2":
        return unique(mamba2_config(dims.head_dim, dims.d_state, state_dtype, act_dtype, t)
                      for t in tile_choices(dims.head_dim, dims.d_state))
    if spec.family == "gdn":
        key_dim, value_dim, make = dims.head_k_dim, dims.head_v_dim, gdn_config
    elif spec.family == "kda":
        key_dim, value_dim, make = dims.head_dim, dims.head_dim, kda_config
    else:
        raise ValueError(f"spec.family: expected mamba2, gdn or kda, got {spec.family!r}")
    return unique(make(key_dim, value_dim, state_dtype, act_dtype, t) for t in tile_choices(value_dim, key_dim))


def unique(configs: Iterable[KernelConfig]) -> list[KernelConfig]:
    """Configs without duplicates, order kept."""
    return list(dict.fromkeys(configs))
