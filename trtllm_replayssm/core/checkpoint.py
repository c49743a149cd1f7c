"""Checkpoint storage of one layer for a StateSpec (core/formats.py), and the reads and writes the float32
references make at the points where the kernels quantize.

A :class:`StoredState` is one copy of every slot's checkpoint ``[slots, heads, rows, cols]`` in one format: a plain
fp32/fp16/bf16 tensor, FP8 codes with an fp32 scale per row, or NVFP4 (packed E2M1 codes, an E4M3 scale per 16
elements, an fp32 second-level scale per row; core/quant.py). A :class:`Checkpoint` is what a layer keeps: the
checkpoint a flush folds from and writes (the master in dual mode), the read copy non-flush steps read (dual mode),
and, with stochastic rounding, the per-slot flush counter that keys the random stream.

The write rule (every family, baseline and replay): a flush folds in fp32, then writes the master from that fp32
state and the read copy from the same fp32 state (not from the rounded master), and counts the flush. With stochastic
rounding, element ``e`` of slot ``s``'s write number ``n`` (the slot's flush count before the write) draws its uniform
from ``quant.sr_uniforms`` with key ``(s, n)``, the layer's seed and stream 0 (master) or 1 (read copy).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_replayssm.core import quant
from trtllm_replayssm.core.formats import FLOAT_DTYPES, StateFormat, StateSpec, get_state_format, state_spec

MASTER_STREAM, READ_STREAM = 0, 1


@dataclass
class StoredState:
    """One copy of every slot's checkpoint in ``fmt``: ``data`` [slots, H, R, C] (plain dtype or FP8 codes) or
    [slots, H, R, C/2] uint8 (NVFP4), ``scale`` [slots, H, R] fp32 (FP8, NVFP4), ``block_scale`` [slots, H, R, C/16]
    float8_e4m3fn (NVFP4)."""

    fmt: StateFormat
    data: torch.Tensor
    scale: torch.Tensor | None = None
    block_scale: torch.Tensor | None = None

    @classmethod
    def allocate(cls, fmt: StateFormat | str, slots: int, shape: tuple[int, int, int],
                 device: torch.device | str, data_slots: int | None = None) -> "StoredState":
        """Zero checkpoints (every element decodes to 0) of ``slots`` slots of ``shape`` = (heads, rows, cols);
        ``data_slots=0``: scales only, the data a tensor bound later (:func:`codes_in_pool`)."""
        fmt = get_state_format(fmt)
        heads, rows, cols = shape
        fmt.row_bytes(cols)  # checks the block multiple
        data = torch.zeros(slots if data_slots is None else data_slots, heads, rows, data_cols(fmt, cols),
                           dtype=fmt.storage_dtype, device=device)
        scale = torch.zeros(slots, heads, rows, dtype=torch.float32, device=device) if fmt.row_scale else None
        block = (torch.zeros(slots, heads, rows, cols // fmt.block, dtype=torch.float8_e4m3fn, device=device)
                 if fmt.block else None)
        return cls(fmt, data, scale, block)

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """[slots, heads, rows, cols] of the values."""
        slots, heads, rows, cols = self.data.shape
        return slots, heads, rows, cols * (2 if self.fmt.elem_bits == 4 else 1)

    def tensors(self) -> dict[str, torch.Tensor]:
        return {name: t for name, t in (("data", self.data), ("scale", self.scale), ("block_scale", self.block_scale))
                if t is not None}

    def decode(self, slots: torch.Tensor) -> torch.Tensor:
        """float32 checkpoints of ``slots`` (int64 ids): [n, H, R, C]."""
        if self.fmt.name == "fp8":
            return quant.dequantize_fp8_rows(self.data[slots], self.scale[slots])
        if self.fmt.name == "nvfp4":
            return quant.dequantize_nvfp4(self.data[slots], self.block_scale[slots], self.scale[slots][..., None])
        return self.data[slots].float()

    def encode_(self, slots: torch.Tensor, values: torch.Tensor, u: torch.Tensor | None = None) -> None:
        """Store the float32 ``values`` [n, H, R, C] as the checkpoints of ``slots``; ``u``: uniforms shaped like
        ``values`` for stochastic rounding (None: round to nearest even)."""
        values = values.float()
        if self.fmt.name == "fp8":
            codes, scale = quant.quantize_fp8_rows(values, u=u)
            self.data[slots], self.scale[slots] = codes, scale
        elif self.fmt.name == "nvfp4":
            g = quant.nvfp4_global_scale(values, (-1,))
            packed, block = quant.quantize_nvfp4(values, g, u=u)
            self.data[slots], self.block_scale[slots], self.scale[slots] = packed, block, g[..., 0]
        else:
            self.data[slots] = quant.to_dtype_rounded(values, self.data.dtype, u=u)


def data_cols(fmt: StateFormat, cols: int) -> int:
    """Last dim of ``fmt``'s data tensor for rows of ``cols`` values (NVFP4: two codes per byte)."""
    return cols // 2 if fmt.elem_bits == 4 else cols


def codes_in_pool(pool: torch.Tensor, fmt: StateFormat) -> torch.Tensor:
    """The data tensor of a quantized checkpoint laid in the bytes of an fp32/fp16/bf16 state pool ``pool``
    [slots, heads, rows, cols] (TensorRT-LLM's, any slot stride, each slot's heads dense): each slot's codes fill the
    first bytes of that slot's region, heads and rows dense as in a dense data tensor, the slot stride the pool's.
    The pool's values and the codes share bytes: what upstream code reads as values must be written back first."""
    if pool.dtype not in FLOAT_DTYPES or pool.dim() != 4:
        raise ValueError(f"state: expected an fp32/fp16/bf16 pool [slots, heads, rows, cols], got {pool.dtype} "
                         f"{tuple(pool.shape)}")
    slots, heads, rows, cols = pool.shape
    if pool.stride()[1:] != (rows * cols, cols, 1):
        raise ValueError(f"state: the pool's heads, rows and cols must be dense within a slot, got strides "
                         f"{list(pool.stride())} for shape {list(pool.shape)}")
    size = pool.element_size()
    width = data_cols(fmt, cols)
    data = torch.empty(0, dtype=torch.uint8, device=pool.device).set_(
        pool.untyped_storage(), pool.storage_offset() * size, (slots, heads, rows, width),
        (pool.stride(0) * size, rows * width, width, 1))
    return data.view(fmt.storage_dtype)


@dataclass
class Checkpoint:
    """A layer's checkpoint storage for ``spec``: ``master`` (the one checkpoint outside dual mode), ``read`` (dual
    mode's read copy), ``flushes`` [slots] int32 (writes so far per slot; stochastic rounding only) and the layer's
    random ``seed``."""

    spec: StateSpec
    master: StoredState
    read: StoredState | None = None
    flushes: torch.Tensor | None = None
    seed: int = 0

    @classmethod
    def allocate(cls, spec: StateSpec, slots: int, shape: tuple[int, int, int], device: torch.device | str,
                 seed: int = 0, master_slots: int | None = None) -> "Checkpoint":
        """Zero storage of ``slots`` slots; ``master_slots=0``: no master data (a tensor bound later; a quantized
        master keeps its scales here)."""
        read = StoredState.allocate(spec.read_format, slots, shape, device) if spec.dual else None
        flushes = torch.zeros(slots, dtype=torch.int32, device=device) if spec.stochastic_rounding else None
        master = StoredState.allocate(spec.checkpoint_format, slots, shape, device, data_slots=master_slots)
        return cls(spec, master, read, flushes, seed)

    @classmethod
    def of_tensor(cls, state: torch.Tensor) -> "Checkpoint":
        """A plain checkpoint over an fp32/fp16/bf16 state pool (round to nearest)."""
        spec = state_spec(state.dtype, arg="state")
        return cls(spec, StoredState(spec.checkpoint_format, state))

    @property
    def shape(self) -> tuple[int, int, int, int]:
        """[slots, heads, rows, cols] of the checkpoints."""
        return self.master.shape

    @property
    def device(self) -> torch.device:
        return self.master.data.device

    def read_values(self, slots: torch.Tensor) -> torch.Tensor:
        """float32 checkpoints a non-flush step reads (the read copy in dual mode)."""
        return (self.read or self.master).decode(slots)

    def fold_values(self, slots: torch.Tensor) -> torch.Tensor:
        """float32 checkpoints a flush folds from (the master)."""
        return self.master.decode(slots)

    def store_(self, slots: torch.Tensor, values: torch.Tensor, write_master: bool = True) -> None:
        """A flush's write: the master and the read copy from the same float32 ``values``, then count the flush.
        ``write_master=False``: the master already holds ``values`` (someone else wrote it, e.g. a prefill into
        TensorRT-LLM's pool); only the read copy and the count follow."""
        u_master = u_read = None
        if self.flushes is not None:
            n = self.flushes[slots].long()
            if self.master.fmt.name != "fp32":
                u_master = quant.sr_uniforms(values.shape, slots, n, self.seed, MASTER_STREAM, values.device)
            if self.read is not None:
                u_read = quant.sr_uniforms(values.shape, slots, n, self.seed, READ_STREAM, values.device)
            self.flushes[slots] = (n + 1).to(torch.int32)
        if write_master:
            self.master.encode_(slots, values, u_master)
        if self.read is not None:
            self.read.encode_(slots, values, u_read)

    def op_tensors(self) -> tuple[torch.Tensor | None, ...]:
        """The master data and the tensors of :data:`OP_TENSORS`, as a custom op takes them (FP8 tensors as uint8
        views: torch's checks of mutated arguments do arithmetic that float8 lacks on CPU)."""
        read = self.read
        tensors = (self.master.data, self.master.scale, self.master.block_scale, None if read is None else read.data,
                   None if read is None else read.scale, None if read is None else read.block_scale, self.flushes)
        return tuple(_bytes(t) for t in tensors)

    @classmethod
    def from_op_args(cls, tensors: tuple[torch.Tensor | None, ...], spec: StateSpec, seed: int) -> "Checkpoint":
        """The inverse of :meth:`op_tensors` (with the spec and the seed)."""
        data, scale, block, read, read_scale, read_block, flushes = tensors
        master = StoredState(spec.checkpoint_format, data.view(spec.checkpoint_format.storage_dtype), scale,
                             None if block is None else block.view(torch.float8_e4m3fn))
        stored_read = None if read is None else StoredState(
            spec.read_format, read.view(spec.read_format.storage_dtype), read_scale,
            None if read_block is None else read_block.view(torch.float8_e4m3fn))
        return cls(spec, master, stored_read, flushes, seed)


# The checkpoint tensors of a custom op's schema (Checkpoint.op_tensors).
OP_TENSORS = ("state", "state_scale", "state_bscale", "read", "read_scale", "read_bscale", "flushes")


def spec_op_args(spec: StateSpec) -> tuple[str, str, str, bool]:
    """A spec as a stored-checkpoint custom op takes it: (state_format, state_mode, master_format or "",
    stochastic_rounding)."""
    return spec.format, spec.mode, spec.master or "", spec.stochastic_rounding


def spec_of_op_args(state_format: str, state_mode: str, master_format: str, stochastic_rounding: bool) -> StateSpec:
    """The inverse of :func:`spec_op_args`."""
    return StateSpec(state_format, state_mode, master_format or None, stochastic_rounding)


def _bytes(t: torch.Tensor | None) -> torch.Tensor | None:
    return t.view(torch.uint8) if t is not None and t.dtype == torch.float8_e4m3fn else t


def as_checkpoint(state: torch.Tensor | Checkpoint) -> Checkpoint:
    """``state`` as a Checkpoint (a plain tensor pool is wrapped)."""
    return state if isinstance(state, Checkpoint) else Checkpoint.of_tensor(state)
