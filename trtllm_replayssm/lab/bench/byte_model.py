"""Bytes moved per decode step (one layer, one sequence): the physical bound every kernel is measured against.

Conventions (peers.md §1.1): S = one sequence's state in the state dtype; activations bf16 (2 B); Mamba-2 dt fp32.
Per-token I/O (``io_bytes``): Mamba-2 reads x, dt, B, C and writes y (no z: gating happens in the norm); GDN reads
q, k, v and the raw gate / beta inputs a, b (act dtype) and writes o; KDA the same with a per-channel a; each row
also reads its int32 slot index.
Per-call constants (A, D, dt_bias, A_log) and per-slot metadata (cursors, arrival counters, FlashInfer's ring trackers,
a few bytes per row) are not counted.

Ring records (one token): Mamba-2 x (H·P) + B (G·N) act dtype + dt (H) fp32; GDN u (HV·V) + k (H·K) act dtype
+ g (HV) fp32; KDA the same with a per-channel g (HV·K) fp32.
"""
from __future__ import annotations

from .shapes import BenchShape

DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp16": 2}
ACT_BYTES = 2
GATE_BYTES = 4
INDEX_BYTES = 4

# impl name -> byte formula kind
BASELINE_IMPLS = ("baseline", "flashinfer_ssu", "mamba_ssm_ssu", "fla_kda")
OUT_OF_PLACE_IMPLS = ("fla_gdn",)  # reads the state, writes a fresh fp32 state
IMPLS = ("replay", "baseline", "flashinfer_ssu", "flashinfer_checkpointing_ssu", "mamba_ssm_ssu", "fla_gdn", "fla_kda")


def dtype_bytes(state_dtype: str) -> int:
    """Bytes per element of a state dtype name (``fp32``, ``bf16``, ``fp16``)."""
    if state_dtype not in DTYPE_BYTES:
        raise ValueError(f"state_dtype: expected one of {sorted(DTYPE_BYTES)}, got {state_dtype!r}")
    return DTYPE_BYTES[state_dtype]


def state_bytes(shape: BenchShape, state_dtype: str) -> int:
    """S: bytes of one sequence's state."""
    return shape.state_elems * dtype_bytes(state_dtype)


def ring_record_bytes(shape: BenchShape) -> int:
    """Bytes of one token's ring record (value + key + gate rings)."""
    value = shape.heads * shape.head_dim * ACT_BYTES
    key = shape.key_heads * shape.key_dim * ACT_BYTES
    gate = shape.heads * (shape.key_dim if shape.family == "kda" else 1) * GATE_BYTES
    return value + key + gate


def io_bytes(shape: BenchShape) -> int:
    """Per-token inputs read + outputs written by one row (module docstring lists them)."""
    value = shape.heads * shape.head_dim * ACT_BYTES  # x / v in, y / o out (same size each)
    if shape.family == "mamba2":
        inputs = value + shape.heads * GATE_BYTES + 2 * shape.key_heads * shape.key_dim * ACT_BYTES  # x, dt, B, C
    else:
        a = shape.heads * (shape.key_dim if shape.family == "kda" else 1) * ACT_BYTES
        inputs = 2 * shape.key_heads * shape.key_dim * ACT_BYTES + value + a + shape.heads * ACT_BYTES  # q,k,v,a,b
    return inputs + value + INDEX_BYTES


def baseline_bytes(shape: BenchShape, state_dtype: str) -> float:
    """Read S, write S, plus I/O."""
    return 2 * state_bytes(shape, state_dtype) + io_bytes(shape)


def out_of_place_bytes(shape: BenchShape, state_dtype: str) -> float:
    """Read S in `state_dtype`, write a new fp32 state, plus I/O (fla-core's public GDN API)."""
    return state_bytes(shape, state_dtype) + state_bytes(shape, "fp32") + io_bytes(shape)


def replay_bytes(shape: BenchShape, state_dtype: str, buffer_len: int) -> float:
    """Our replay step averaged over a whole L-cycle of one slot (cursor w = 0 .. L-1).

    Every step reads S and the w filled ring entries (mean (L-1)/2; KDA's pre-decayed keys: their values and keys
    and, for w >= 1, one gate row G_{w-1}); the L-1 non-flush steps append one record; the flush step (w = L-1)
    writes S. With L = 1 this is the baseline.
    """
    if not isinstance(buffer_len, int) or buffer_len < 1:
        raise ValueError(f"buffer_len: expected an int >= 1, got {buffer_len!r}")
    s = state_bytes(shape, state_dtype)
    rec = ring_record_bytes(shape)
    L = buffer_len
    if shape.family == "kda":
        gate_row = shape.heads * shape.key_dim * GATE_BYTES
        ring_read = (rec - gate_row) * (L - 1) / 2 + gate_row * (L - 1) / L
    else:
        ring_read = rec * (L - 1) / 2
    return s + ring_read + rec * (L - 1) / L + s / L + io_bytes(shape)


def checkpointing_ssu_bytes(shape: BenchShape, state_dtype: str, window: int) -> float:
    """FlashInfer ``checkpointing_ssu``, single-token decode, ring R = window + 1, averaged over its W-step cycle.

    With the caller's tracker rule the replayed count runs 1 .. W: every step reads S and that many records (mean
    (W+1)/2) and appends the new token; the step at W flushes (writes S).
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window: expected an int >= 1, got {window!r}")
    s = state_bytes(shape, state_dtype)
    rec = ring_record_bytes(shape)
    return s + rec * (window + 1) / 2 + rec + s / window + io_bytes(shape)


def step_bytes(impl: str, shape: BenchShape, state_dtype: str, buffer_len: int, mode: str | None = None) -> float:
    """Bytes per decode step per sequence for `impl`; `mode` (resolved: ``replay`` or ``flush``) only for ours."""
    if impl == "replay":
        if mode not in ("replay", "flush"):
            raise ValueError(f"mode: expected a resolved mode 'replay' or 'flush' for impl 'replay', got {mode!r}")
        return replay_bytes(shape, state_dtype, buffer_len) if mode == "replay" else baseline_bytes(shape, state_dtype)
    if impl in BASELINE_IMPLS:
        return baseline_bytes(shape, state_dtype)
    if impl in OUT_OF_PLACE_IMPLS:
        return out_of_place_bytes(shape, state_dtype)
    if impl == "flashinfer_checkpointing_ssu":
        return checkpointing_ssu_bytes(shape, state_dtype, buffer_len)
    raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")


def ideal_speedup(shape: BenchShape, state_dtype: str, buffer_len: int) -> float:
    """Baseline bytes over replay bytes: the speed-up of two kernels running at the same bandwidth."""
    return baseline_bytes(shape, state_dtype) / replay_bytes(shape, state_dtype, buffer_len)
