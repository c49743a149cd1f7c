"""State formats of the checkpoint: how a state element is stored, and what scale tensors come with it.

fp32 / fp16 / bf16 store the state as a plain tensor. Quantized formats drop in here with their scale layout:
FP8-E4M3 with one fp32 scale per state row (head, row) and NVFP4 (E2M1 codes, one E4M3 scale per 16 elements along the
last axis, plus an fp32 per-tensor scale). Kernels receive the format as a compile-time constant.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateFormat:
    """Storage of one checkpoint element: dtype of the data tensor, bytes per element (scales included)."""

    name: str
    storage_dtype: torch.dtype
    bytes_per_element: float
    block_size: int = 0          # elements sharing one scale along the last axis (0: no scales)
    implemented: bool = True

    def scale_shape(self, state_shape: tuple[int, ...]) -> tuple[int, ...] | None:
        """Shape of the scale tensor for a state of ``state_shape`` (None for unscaled formats)."""
        if self.block_size == 0:
            return None
        *lead, last = state_shape
        if self.block_size < 0:  # one scale per row
            return (*lead, 1)
        if last % self.block_size:
            raise ValueError(f"state last dim {last} is not a multiple of the {self.name} block size {self.block_size}")
        return (*lead, last // self.block_size)

    def allocate(self, shape: tuple[int, ...], device: torch.device | str) -> torch.Tensor:
        """A zero-initialised data tensor of this format (unscaled formats only for now)."""
        if not self.implemented:
            raise NotImplementedError(f"state format {self.name!r} is planned but not implemented yet")
        return torch.zeros(shape, dtype=self.storage_dtype, device=device)


STATE_FORMATS: dict[str, StateFormat] = {
    "fp32": StateFormat("fp32", torch.float32, 4.0),
    "fp16": StateFormat("fp16", torch.float16, 2.0),
    "bf16": StateFormat("bf16", torch.bfloat16, 2.0),
    # Planned (quantized checkpoints): listed so memory plans can price them; allocation raises until implemented.
    "fp8": StateFormat("fp8", torch.float8_e4m3fn, 1.0, block_size=-1, implemented=False),
    "nvfp4": StateFormat("nvfp4", torch.uint8, 0.5625, block_size=16, implemented=False),
}
_ALIASES = {"float32": "fp32", "float16": "fp16", "half": "fp16", "bfloat16": "bf16", "auto": "fp32"}


def get_state_format(spec: str | torch.dtype | StateFormat) -> StateFormat:
    """Resolve a format name (``fp32``/``bf16``/...), a torch dtype or a StateFormat."""
    if isinstance(spec, StateFormat):
        return spec
    if isinstance(spec, torch.dtype):
        for fmt in STATE_FORMATS.values():
            if fmt.storage_dtype == spec and fmt.implemented:
                return fmt
        raise ValueError(f"state_dtype: unsupported dtype {spec}; expected one of fp32, fp16, bf16")
    key = _ALIASES.get(spec.lower(), spec.lower())
    if key not in STATE_FORMATS:
        raise ValueError(f"state_dtype: unknown state format {spec!r}; expected one of {sorted(STATE_FORMATS)}")
    return STATE_FORMATS[key]
