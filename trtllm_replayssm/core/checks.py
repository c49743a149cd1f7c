"""Argument validation shared by the ops: every error names the argument, the expectation and what was given."""
from __future__ import annotations

from typing import Sequence

import torch

from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.checkpoint import Checkpoint
from trtllm_replayssm.core.formats import FLOAT_DTYPES


def check_state(state: torch.Tensor | Checkpoint) -> tuple[tuple[int, int, int, int], torch.device]:
    """``[slots, heads, rows, cols]`` and device of a state pool (fp32/fp16/bf16, the last two dims dense) or of a
    Checkpoint (allocated consistently by the cache)."""
    if isinstance(state, Checkpoint):
        return state.shape, state.device
    check_tensor("state", state, (None, None, None, None), FLOAT_DTYPES, inner_contiguous=2)
    return tuple(state.shape), state.device


def check_stored_for_kernels(ckpt: Checkpoint) -> None:
    """What the CUDA kernels need of a stored checkpoint (before any launch): rows whose codes split evenly over a
    warp's lanes (FP8: 32, 64, 128, 256 or a multiple of 512 columns; NVFP4: 64, 128, 256 or 512, a lane's columns
    within one 16-element block), dense scale and read-copy tensors (the kernels index them from the slot, head
    and row) and master codes dense within a slot, whose stride keeps 16-byte alignment (codes in a served pool)."""
    cols = ckpt.shape[-1]
    for stored in (ckpt.master, ckpt.read):
        if stored is None or not stored.fmt.quantized:
            continue
        allowed = (64, 128, 256, 512) if stored.fmt.block else (32, 64, 128, 256)
        if cols not in allowed and (stored.fmt.block or cols % 512):
            more = "" if stored.fmt.block else " or a multiple of 512"
            raise ValueError(f"state: {stored.fmt.name} checkpoints on CUDA need rows (last dim) of "
                             f"{', '.join(map(str, allowed))}{more}, got {cols}")
        for name, t in stored.tensors().items():
            slot_strided = stored is ckpt.master and name == "data"
            if not (t[:1] if slot_strided else t).is_contiguous():
                raise ValueError(f"state: the {stored.fmt.name} checkpoint's {name} tensor must be contiguous"
                                 + (" within a slot" if slot_strided else ""))
            if slot_strided:
                check_aligned("state", t, 16)
    if ckpt.flushes is not None and (ckpt.flushes.dtype != torch.int32 or not ckpt.flushes.is_contiguous()):
        raise ValueError("state: the flush counters must be a contiguous int32 tensor")


def check_stored_state_update(state: torch.Tensor | Checkpoint) -> bool:
    """Whether a baseline step's ``state`` is a stored checkpoint (then checked for the kernels on CUDA: no
    stochastic rounding, which needs the replay op's per-slot write counters)."""
    stored = isinstance(state, Checkpoint) and state.spec.stored
    if stored and state.device.type == "cuda":
        check_stored_for_kernels(state)
        if state.spec.stochastic_rounding:
            raise ValueError("state: the baseline kernel does not round stochastically (it keeps no per-slot write "
                             "counter); use replay_decode(mode='flush') for stochastically rounded checkpoints")
    return stored


def check_tensor(name: str, t: object, shape: Sequence[int | None], dtypes: Sequence[torch.dtype],
                 device: torch.device | None = None, inner_contiguous: int = 1,
                 dtype_of: str | None = None) -> torch.Tensor:
    """Check type, rank/shape (None = any), dtype, device, and that the last ``inner_contiguous`` dims are dense.
    ``dtype_of``: the argument whose dtype ``dtypes[0]`` is (named in the error: the two must match)."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != len(shape) or any(e is not None and e != a for e, a in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if e is None else str(e) for e in shape) + "]"
        raise ValueError(f"{name}: expected shape {want}, got {list(t.shape)}")
    if t.dtype not in dtypes:
        if dtype_of is not None:
            others = "".join(f" or {d}" for d in dtypes[1:])
            raise TypeError(f"{name}: expected the dtype of {dtype_of} ({dtypes[0]}){others}, got {t.dtype}")
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got {t.device}")
    expected_stride = 1
    for dim in range(t.dim() - 1, t.dim() - 1 - inner_contiguous, -1):
        if t.shape[dim] > 1 and t.stride(dim) != expected_stride:
            raise ValueError(f"{name}: the last {inner_contiguous} dim(s) must be contiguous "
                             f"(strides {list(t.stride())} for shape {list(t.shape)})")
        expected_stride *= t.shape[dim]
    return t


def check_optional(name: str, t: object, shape: Sequence[int | None], dtypes: Sequence[torch.dtype],
                   device: torch.device | None = None, inner_contiguous: int = 1,
                   dtype_of: str | None = None) -> torch.Tensor | None:
    return None if t is None else check_tensor(name, t, shape, dtypes, device, inner_contiguous, dtype_of)


def check_aligned(name: str, t: torch.Tensor, elems: int) -> None:
    """Vector loads read ``elems`` consecutive elements: the base and the strides of outer dims must keep alignment."""
    bytes_ = elems * t.element_size()
    align = min(bytes_, 16)
    if t.data_ptr() % align or any(s * t.element_size() % align for s in t.stride()[:-1] if s):
        raise ValueError(f"{name}: rows must be {align}-byte aligned for vector loads "
                         f"(data_ptr % {align} = {t.data_ptr() % align}, strides {list(t.stride())})")


def check_scratch_rows(batch: int, slots: int) -> None:
    """The replay's per-step scratch has one row per slot and is indexed by batch row: batch <= slots."""
    if batch > slots:
        raise ValueError(f"x: batch {batch} exceeds the cache's {slots} slots (the replay scratch has one row per slot)")


def check_int(name: str, value: object) -> int:
    """``value`` as an int (bool is rejected: it is not an id)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int, got {type(value).__name__} {value!r}")
    return value


def slot_indices(name: str, idx: torch.Tensor | None, batch: int, slots: int, pad_slot_id: int,
                 device: torch.device) -> torch.Tensor:
    """Validate ``state_batch_indices`` ([batch] int32); default: rows 0..batch-1 map to slots 0..batch-1.

    The contract of every op (docs/design.md, "Rows a step skips"): each id is ``pad_slot_id`` or a slot in
    ``[0, slots)``, and no slot appears twice. Checked here for CPU tensors (a device check would need a sync, see
    :func:`check_step_values`); on CUDA the kernels skip a row that breaks it.
    """
    check_int("pad_slot_id", pad_slot_id)
    if idx is None:
        if batch > slots:
            raise ValueError(f"{name}: batch {batch} exceeds the {slots} cache slots; pass explicit slot indices")
        return torch.arange(batch, dtype=torch.int32, device=device)
    check_tensor(name, idx, (batch,), (torch.int32,), device)
    if idx.device.type == "cpu":
        check_slot_values(name, idx, slots, pad_slot_id)
    return idx


def check_slot_values(name: str, idx: torch.Tensor, slots: int, pad_slot_id: int | None = None) -> None:
    """Every id of ``idx`` is in ``[0, slots)`` (or ``pad_slot_id``) and none but the pad id appears twice."""
    ids = idx.long().cpu()
    live = ids[ids != pad_slot_id] if pad_slot_id is not None else ids
    bad = (live < 0) | (live >= slots)
    if bool(bad.any()):
        pad = f" or pad_slot_id={pad_slot_id}" if pad_slot_id is not None else ""
        raise ValueError(f"{name}: values must be in [0, {slots}){pad}, got {live[bad].tolist()}")
    uniq, counts = torch.unique(live, return_counts=True)
    if bool((counts > 1).any()):
        raise ValueError(f"{name}: each slot at most once per call, got repeated ids {uniq[counts > 1].tolist()}")


def check_cursors(cursor: torch.Tensor, idx: torch.Tensor, pad_slot_id: int, ring_len: int,
                  name: str = "layer.cursor") -> None:
    """The cursors of the batch's slots are in ``[0, ring_len)`` (a cursor outside was corrupted by a caller)."""
    ids = idx.long().cpu()
    ids = ids[ids != pad_slot_id]
    w = cursor.cpu()[ids]
    bad = (w < 0) | (w >= ring_len)
    if bool(bad.any()):
        raise ValueError(f"{name}: expected values in [0, {ring_len}) for the batch's slots, got "
                         f"{dict(zip(ids[bad].tolist(), w[bad].tolist()))} (slot: cursor); reset_slots() empties a "
                         f"slot's ring")


def spec_word(cursor: torch.Tensor, slot: int, window: int, ring_len: int) -> tuple[int, int]:
    """``(origin, count)`` of the speculative cursor word of ``slot`` if a verify of ``window`` tokens can run from it
    (``spec_cursor.valid``); ValueError naming the word otherwise."""
    word = int(cursor[slot])
    if not spec_cursor.valid(word, window, ring_len):
        raise ValueError(f"cursor: slot {slot} holds word {word} (origin, count) = {spec_cursor.unpack(word)}; a "
                         f"window of {window} needs origin < {ring_len} and count + {window} <= {ring_len} "
                         f"(spec_cursor.commit_ keeps it so)")
    return spec_cursor.unpack(word)


def check_step_values(idx: torch.Tensor, slots: int, pad_slot_id: int, cursor: torch.Tensor | None, ring_len: int,
                      rows: dict[str, torch.Tensor | None], params: dict[str, torch.Tensor | None]) -> None:
    """The debugging check (``check_values=True``, any device, syncs): slot ids and cursors as on the CPU, and every
    input finite: ``rows`` (batch-major; pad rows are not checked) and ``params`` (per head). A NaN or Inf stays in
    its slot until a prefill hand-off (docs/design.md, "NaN and Inf")."""
    check_slot_values("state_batch_indices", idx, slots, pad_slot_id)
    if cursor is not None:
        check_cursors(cursor, idx, pad_slot_id, ring_len)
    pad = (idx == pad_slot_id).cpu()
    for group, tensors in (("rows", rows), ("params", params)):
        for name, t in tensors.items():
            if t is None:
                continue
            finite = torch.isfinite(t.detach().float().cpu())
            if group == "rows":
                finite |= pad.view(-1, *([1] * (finite.dim() - 1)))
            if not bool(finite.all()):
                where = torch.nonzero(~finite)[0].tolist()
                value = t[tuple(where)].item()
                raise ValueError(f"{name}: expected finite values, got {value} at index {where}")


def capturing() -> bool:
    """True while the current CUDA stream records a graph (checks that read device values on the host must wait)."""
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()
