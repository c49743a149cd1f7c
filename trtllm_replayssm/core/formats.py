"""The one table of element types: the float dtypes of states and activations (names, torch dtype, bytes, the C++
type the kernels are compiled with) and the checkpoint state formats built on them.

A layer's checkpoint is described by a :class:`StateSpec`: a plain fp32 / fp16 / bf16 tensor, one quantized (FP8 or
NVFP4) checkpoint, or a master checkpoint plus a quantized read copy (docs/design.md, quantized state).
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
FLOAT_DTYPES: tuple[torch.dtype, ...] = tuple(d.torch for d in DTYPES)  # states and activations
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
    """Storage of one checkpoint row of ``cols`` elements (the contiguous state axis): the data tensor's dtype and
    bits per element, an fp32 scale per row (FP8's scale, NVFP4's second-level scale) and one E4M3 scale per
    ``block`` elements (NVFP4)."""

    name: str
    storage_dtype: torch.dtype
    elem_bits: int
    row_scale: bool = False
    block: int = 0

    @property
    def quantized(self) -> bool:
        return self.row_scale

    def row_bytes(self, cols: int) -> int:
        """Bytes of one state row of ``cols`` elements, scales included."""
        if self.block and cols % self.block:
            raise ValueError(f"cols: {self.name} needs a multiple of {self.block} columns, got {cols}")
        return cols * self.elem_bits // 8 + (cols // self.block if self.block else 0) + (4 if self.row_scale else 0)


STATE_FORMATS: dict[str, StateFormat] = {
    **{d.name: StateFormat(d.name, d.torch, 8 * d.bytes) for d in DTYPES},
    # FP8-E4M3 codes with one fp32 scale per state row; NVFP4: E2M1 codes two per byte, one E4M3 scale per 16
    # elements along the row and an fp32 second-level scale per row (core/quant.py, docs/design.md).
    "fp8": StateFormat("fp8", torch.float8_e4m3fn, 8, row_scale=True),
    "nvfp4": StateFormat("nvfp4", torch.uint8, 4, row_scale=True, block=16),
}
QUANT_FORMATS: tuple[str, ...] = ("fp8", "nvfp4")
MASTER_FORMATS: tuple[str, ...] = (*DTYPE_NAMES, "fp8")
STATE_MODES: tuple[str, ...] = ("plain", "shared", "dual")


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


@dataclass(frozen=True)
class StateSpec:
    """How a layer stores its checkpoint.

    * ``plain``: one fp32/fp16/bf16 checkpoint (``format``).
    * ``shared``: one quantized checkpoint (``format`` fp8 or nvfp4): every flush decodes it, folds in fp32 and
      re-encodes it, and non-flush steps read it.
    * ``dual``: a ``master`` checkpoint (fp32/fp16/bf16/fp8) that only flushes read and write, and a read copy in
      ``format`` (fp8 or nvfp4) that each flush rewrites from the same fp32 fold and that non-flush steps read.

    ``stochastic_rounding``: every rounded checkpoint write rounds stochastically (core/quant.py); otherwise to
    nearest, ties to even. Build one with :func:`state_spec`.
    """

    format: str = "fp32"
    mode: str = "plain"
    master: str | None = None
    stochastic_rounding: bool = False

    @property
    def read_format(self) -> StateFormat:
        """What a non-flush step reads."""
        return STATE_FORMATS[self.format]

    @property
    def checkpoint_format(self) -> StateFormat:
        """What a flush folds from and writes back (the master in dual mode)."""
        return STATE_FORMATS[self.master if self.mode == "dual" else self.format]

    @property
    def dual(self) -> bool:
        return self.mode == "dual"

    @property
    def quantized(self) -> bool:
        return self.mode != "plain"

    @property
    def stored(self) -> bool:
        """Whether the checkpoint keeps storage besides a plain pool (quantized, dual, stochastic rounding): the
        stored-checkpoint ops and kernels (Mamba-2 on CUDA)."""
        return self.quantized or self.stochastic_rounding

    def row_bytes(self, cols: int) -> int:
        """Bytes one state row occupies: the checkpoint plus, in dual mode, the read copy."""
        extra = self.read_format.row_bytes(cols) if self.dual else 0
        return self.checkpoint_format.row_bytes(cols) + extra

    @property
    def label(self) -> str:
        """``fp32``, ``nvfp4``, ``nvfp4/dual/fp16``, with ``+sr`` for stochastic rounding."""
        name = f"{self.format}/dual/{self.master}" if self.dual else self.format
        return name + ("+sr" if self.stochastic_rounding else "")

    @property
    def summary(self) -> str:
        """One line on how the checkpoint is stored."""
        if self.dual:
            text = f"dual: {self.format} read copy for non-flush steps, {self.master} master for flushes"
        elif self.quantized:
            text = f"shared: one {self.format} checkpoint for every step"
        else:
            text = f"plain {self.format} checkpoint"
        return text + (", stochastic rounding" if self.stochastic_rounding else "")

    def to_dict(self) -> dict:
        return {"state_format": self.format, "state_mode": self.mode, "master_format": self.master,
                "stochastic_rounding": self.stochastic_rounding}


def state_spec(value: str | torch.dtype | StateSpec = "fp32", mode: str | None = None, master: str | None = None,
               stochastic_rounding: bool = False, arg: str = "state_format") -> StateSpec:
    """A checked StateSpec. ``value``: a StateSpec (returned as it is when no other argument is given), a format name
    or torch dtype. ``mode`` defaults to ``plain`` for fp32/fp16/bf16 (where ``shared`` means the same) and ``shared``
    for fp8/nvfp4; ``master`` (dual only) defaults to fp32. Errors name the argument and what is accepted."""
    if isinstance(value, StateSpec):
        if mode is None and master is None and not stochastic_rounding:
            return value
        value = value.format
    fmt = get_state_format(value, arg).name
    if mode is not None and (not isinstance(mode, str) or mode.lower() not in STATE_MODES):
        raise ValueError(f"state_mode: expected one of {', '.join(STATE_MODES)}, got {mode!r}")
    mode = (mode or ("shared" if fmt in QUANT_FORMATS else "plain")).lower()
    if not isinstance(stochastic_rounding, bool):
        raise TypeError(f"stochastic_rounding: expected a bool, got {type(stochastic_rounding).__name__}")
    if mode == "dual":
        if fmt not in QUANT_FORMATS:
            raise ValueError(f"{arg}: dual mode keeps a quantized read copy, expected one of "
                             f"{', '.join(QUANT_FORMATS)}, got {fmt}")
        master = get_state_format(master or "fp32", "master_format").name
        if master not in MASTER_FORMATS or master == fmt:
            allowed = ", ".join(m for m in MASTER_FORMATS if m != fmt)
            raise ValueError(f"master_format: expected one of {allowed} for a {fmt} read copy, got {master}")
    elif master is not None:
        raise ValueError(f"master_format: only dual mode has a master checkpoint (state_mode is {mode})")
    elif mode == "plain" and fmt in QUANT_FORMATS:
        raise ValueError(f"state_mode: plain keeps an {'/'.join(DTYPE_NAMES)} checkpoint; {fmt} is shared or dual")
    else:
        mode = "shared" if fmt in QUANT_FORMATS else "plain"
    spec = StateSpec(fmt, mode, master, stochastic_rounding)
    if stochastic_rounding and spec.checkpoint_format.name == "fp32" and not spec.dual:
        raise ValueError("stochastic_rounding: an fp32 checkpoint has no rounded writes")
    return spec


def parse_state_label(label: str | StateSpec, arg: str = "state") -> StateSpec:
    """The StateSpec of a label as ``StateSpec.label`` writes it: ``fp32``, ``nvfp4``, ``nvfp4/dual/fp16``, with
    ``+sr`` for stochastic rounding (a StateSpec is returned as it is)."""
    if isinstance(label, StateSpec):
        return label
    if not isinstance(label, str):
        raise TypeError(f"{arg}: expected a state label such as 'nvfp4/dual/fp16+sr', got {type(label).__name__}")
    sr = label.endswith("+sr")
    parts = label.removesuffix("+sr").split("/")
    if len(parts) not in (1, 3) or (len(parts) == 3 and parts[1] != "dual"):
        raise ValueError(f"{arg}: expected FORMAT or FORMAT/dual/MASTER with an optional '+sr', got {label!r}")
    return state_spec(parts[0], "dual" if len(parts) == 3 else None, parts[2] if len(parts) == 3 else None, sr,
                      arg=arg)
