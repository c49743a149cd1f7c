"""The one table of element types: the float dtypes of states and activations (names, torch dtype, bytes, the C++
type the kernels are compiled with) and the checkpoint state formats built on them.

fp32 / fp16 / bf16 states are plain tensors. Quantized formats are listed so memory plans can price them;
allocating one raises until its kernels exist.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class DType:
    """A float element type: ``name`` (fp32/fp16/bf16), its torch dtype, bytes, C++ type and kernel-name tag."""

    name: str
    torch: torch.dtype
    bytes: int
    cuda: str
    tag: str
    aliases: tuple[str, ...]


DTYPES: tuple[DType, ...] = (
    DType("fp32", torch.float32, 4, "float", "f32", ("float32", "f32", "float")),
    DType("fp16", torch.float16, 2, "__half", "f16", ("float16", "f16", "half")),
    DType("bf16", torch.bfloat16, 2, "__nv_bfloat16", "bf16", ("bfloat16",)),
)
DTYPE_NAMES: tuple[str, ...] = tuple(d.name for d in DTYPES)
_BY_NAME = {alias: d for d in DTYPES for alias in (d.name, *d.aliases)}
_BY_TORCH = {d.torch: d for d in DTYPES}


def get_dtype(value: str | torch.dtype | DType, arg: str = "dtype") -> DType:
    """The DType of a name (``fp32``, ``bfloat16``, ...), a torch dtype or a DType; ValueError naming ``arg``."""
    if isinstance(value, DType):
        return value
    if isinstance(value, torch.dtype):
        if value in _BY_TORCH:
            return _BY_TORCH[value]
        raise ValueError(f"{arg}: unsupported dtype {value}; expected one of {', '.join(DTYPE_NAMES)}")
    if isinstance(value, str) and value.lower() in _BY_NAME:
        return _BY_NAME[value.lower()]
    raise ValueError(f"{arg}: unknown dtype {value!r}; expected one of {', '.join(DTYPE_NAMES)}")


def torch_dtype(value: str | torch.dtype | DType, arg: str = "dtype") -> torch.dtype:
    """The torch dtype of a dtype name or torch dtype (see get_dtype)."""
    return get_dtype(value, arg).torch


def dtype_name(value: str | torch.dtype | DType, arg: str = "dtype") -> str:
    """The short name (``fp32``/``fp16``/``bf16``) of a dtype name or torch dtype."""
    return get_dtype(value, arg).name


@dataclass(frozen=True)
class StateFormat:
    """Storage of one checkpoint element: the data tensor's dtype and bytes per element, scales included."""

    name: str
    storage_dtype: torch.dtype
    bytes_per_element: float
    implemented: bool = True

    def allocate(self, shape: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
        """A zero-initialised state tensor of this format."""
        if not self.implemented:
            raise NotImplementedError(f"state format {self.name!r} is planned but not implemented yet")
        return torch.zeros(shape, dtype=self.storage_dtype, device=device)


STATE_FORMATS: dict[str, StateFormat] = {
    **{d.name: StateFormat(d.name, d.torch, float(d.bytes)) for d in DTYPES},
    # Planned quantized checkpoints: FP8-E4M3 with one fp32 scale per state row; NVFP4 (E2M1 codes, one E4M3 scale
    # per 16 elements along the last axis).
    "fp8": StateFormat("fp8", torch.float8_e4m3fn, 1.0, implemented=False),
    "nvfp4": StateFormat("nvfp4", torch.uint8, 0.5625, implemented=False),
}


def get_state_format(value: str | torch.dtype | StateFormat, arg: str = "state_dtype") -> StateFormat:
    """The StateFormat of a format name (``fp32``/``bf16``/..., ``auto`` = fp32), a torch dtype or a StateFormat."""
    if isinstance(value, StateFormat):
        return value
    if isinstance(value, str) and value.lower() in STATE_FORMATS:
        return STATE_FORMATS[value.lower()]
    if isinstance(value, str) and value.lower() == "auto":
        return STATE_FORMATS["fp32"]
    try:
        return STATE_FORMATS[get_dtype(value, arg).name]
    except ValueError:
        raise ValueError(f"{arg}: unknown state format {value!r}; expected one of {sorted(STATE_FORMATS)}") from None
