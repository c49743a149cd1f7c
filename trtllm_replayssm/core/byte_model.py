"""The byte model: HBM bytes one decode step of one SSM layer moves for one sequence, and the ring memory it holds.
Used by the memory plan, ``inspect`` and the bundle manifest (predictions) and by the kernel benchmark (achieved
bandwidth).

Per token a row reads its inputs and writes its output (:func:`io_bytes`): Mamba-2 x, dt (fp32), B, C and y; GDN q,
k, v, the raw gate and beta inputs and o; KDA the same with a per-channel gate; every row also reads its int32 slot
index. z is not counted: the serving path gates in the norm after the op. Per-call constants (A, D, dt_bias, A_log)
and per-slot metadata (cursors, arrival counters) are not counted.

A ring record (one token, :func:`record_bytes`): the value ring (Mamba-2 x, GDN/KDA u) and key ring (Mamba-2 B, GDN
k per key head, KDA k per value head) in the activation dtype (KDA keys: fp32 under fp16 activations), and the gate
ring in fp32 (Mamba-2 Δ and GDN one per head, KDA one per key channel).

The baseline reads and writes the state: ``2|S| + io``. Replay, averaged over a whole L-cycle of one slot (cursor
w = 0 .. L-1): every step reads S and the w filled ring entries (mean (L-1)/2; with KDA's pre-decayed keys their
values and keys and, for w >= 1, one gate row), the L-1 non-flush steps append a record, the flush step writes S:
``|S|(1 + 1/L) + ring read + (L-1)/L record + io``. With L = 1 both are equal.

State bytes follow the layer's StateSpec (core/formats.py): a quantized checkpoint counts its scales. In dual mode
the L-1 non-flush steps read the read copy R and the flush reads the master M and writes M and R:
``(L-1)/L |R| + (2|M| + |R|)/L`` in place of ``|S|(1 + 1/L)``.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from trtllm_replayssm.core.dims import SSMDims
from trtllm_replayssm.core.formats import StateFormat, StateSpec, get_dtype, state_spec
from trtllm_replayssm.core.layouts import key_ring_dtype
from trtllm_replayssm.core.limits import check_buffer_len

GATE_BYTES = 4  # fp32 gate ring entries and Mamba-2's dt input
INDEX_BYTES = 4


StateLike = str | torch.dtype | StateSpec


def format_bytes(dims: SSMDims, fmt: StateFormat) -> int:
    """Bytes of one sequence's state (all heads) stored in ``fmt``, scales included."""
    return dims.heads * dims.rows * fmt.row_bytes(dims.cols)


def codes_bytes(dims: SSMDims, fmt: StateFormat) -> int:
    """Bytes of one sequence's state in ``fmt`` without its scales (FP8/NVFP4 codes; a plain format's values)."""
    return dims.heads * dims.rows * dims.cols * fmt.elem_bits // 8


def state_bytes(dims: SSMDims, state: StateLike) -> int:
    """|S|: bytes one sequence's checkpoint occupies (``state``: a StateSpec, a format name or dtype); in dual mode
    the master plus the read copy."""
    return dims.heads * dims.rows * state_spec(state).row_bytes(dims.cols)


def gate_elems(dims: SSMDims) -> int:
    """fp32 gate-ring elements per token (Mamba-2 Δ and GDN: one per head; KDA: one per key channel)."""
    return dims.heads * (dims.cols if dims.per_channel_gate else 1)


def record_bytes(dims: SSMDims, act_dtype: str | torch.dtype) -> int:
    """Bytes of one token's ring record: value, key and gate rings."""
    act = get_dtype(act_dtype, "act_dtype")
    key_elem = key_ring_dtype(act.torch, dims.per_channel_gate).itemsize
    return dims.heads * dims.rows * act.bytes + dims.key_heads * dims.cols * key_elem + gate_elems(dims) * GATE_BYTES


def io_bytes(dims: SSMDims, act_dtype: str | torch.dtype) -> int:
    """Per-token inputs read and outputs written by one row (module docstring lists them)."""
    act = get_dtype(act_dtype, "act_dtype").bytes
    value = dims.heads * dims.rows * act  # x / v in, y / o out (the same size each)
    keys = 2 * dims.key_heads * dims.cols * act  # B, C / q, k
    return 2 * value + keys + dims.gate_input_bytes(act) + INDEX_BYTES


def ring_read_bytes(dims: SSMDims, act_dtype: str | torch.dtype, buffer_len: int) -> float:
    """Ring bytes one step reads, averaged over cursors 0 .. L-1."""
    L = check_buffer_len(buffer_len)
    rec = record_bytes(dims, act_dtype)
    if not dims.per_channel_gate:
        return rec * (L - 1) / 2
    gate_row = gate_elems(dims) * GATE_BYTES  # pre-decayed keys: one gate row per step (w >= 1), not w of them
    return (rec - gate_row) * (L - 1) / 2 + gate_row * (L - 1) / L


@dataclass(frozen=True)
class StepBytes:
    """Bytes per decode step of one layer and one sequence: the baseline and the replay (averaged over a cycle)."""

    baseline: float
    replay: float

    @property
    def speedup(self) -> float:
        """Baseline bytes over replay bytes: the speed-up of two kernels running at the same bandwidth."""
        return self.baseline / self.replay


def baseline_bytes(dims: SSMDims, state: StateLike, act_dtype: str | torch.dtype) -> float:
    """Read S, write S, plus I/O (S in the checkpoint format: the master in dual mode)."""
    return 2 * format_bytes(dims, state_spec(state).checkpoint_format) + io_bytes(dims, act_dtype)


def _checkpoint_traffic(dims: SSMDims, spec: StateSpec, L: int) -> float:
    """State bytes per step over a cycle: L-1 non-flush reads of the read copy, one flush read and write."""
    read, ckpt = format_bytes(dims, spec.read_format), format_bytes(dims, spec.checkpoint_format)
    flush_write = ckpt + (read if spec.dual else 0)
    return (read * (L - 1) + ckpt + flush_write) / L


def replay_bytes(dims: SSMDims, state: StateLike, act_dtype: str | torch.dtype, buffer_len: int) -> float:
    """Our replay step averaged over a whole L-cycle (module docstring)."""
    spec, L = state_spec(state), check_buffer_len(buffer_len)
    return (_checkpoint_traffic(dims, spec, L) + ring_read_bytes(dims, act_dtype, L)
            + record_bytes(dims, act_dtype) * (L - 1) / L + io_bytes(dims, act_dtype))


def nonflush_bytes(dims: SSMDims, state: StateLike, act_dtype: str | torch.dtype, buffer_len: int) -> float:
    """A non-flush replay step averaged over cursors 0 .. L-2: the read copy, the filled ring entries, the appended
    record and I/O (L >= 2)."""
    spec, L = state_spec(state), check_buffer_len(buffer_len)
    if L < 2:
        raise ValueError("buffer_len: a ring of length 1 has no non-flush steps")
    rec = record_bytes(dims, act_dtype)
    if dims.per_channel_gate:  # pre-decayed keys: values and keys of w entries, one gate row for w >= 1
        gate_row = gate_elems(dims) * GATE_BYTES
        ring = (rec - gate_row) * (L - 2) / 2 + gate_row * (L - 2) / (L - 1)
    else:
        ring = rec * (L - 2) / 2
    return format_bytes(dims, spec.read_format) + ring + rec + io_bytes(dims, act_dtype)


def step_bytes(dims: SSMDims, state: StateLike, act_dtype: str | torch.dtype, buffer_len: int) -> StepBytes:
    """Baseline and replay bytes per step."""
    return StepBytes(baseline_bytes(dims, state, act_dtype), replay_bytes(dims, state, act_dtype, buffer_len))
