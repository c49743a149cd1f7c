"""Bytes per decode step of every benchmarked implementation (one layer, one sequence, bf16 activations), from the
byte model of core/byte_model.py: ours and the peers' kernels are measured against the same numbers.

Peers: FlashInfer's SSU, mamba-ssm's SSU and fla-core's pooled KDA kernel (also run as GDN, ``fla_gdn_pooled``, whose
gate repeated along K adds under 1% to its bytes, not counted) read and write the state like our baseline; fla-core's
GDN reads the state in its dtype and writes a fresh fp32 state; FlashInfer's ``checkpointing_ssu`` replays a ring
of R = window + 1 records (:func:`checkpointing_ssu_bytes`).
"""
from __future__ import annotations

from trtllm_replayssm.core import byte_model as core

from .shapes import BenchShape

ACT_DTYPE = "bf16"
BASELINE_IMPLS = ("baseline", "flashinfer_ssu", "mamba_ssm_ssu", "fla_kda", "fla_gdn_pooled")
OUT_OF_PLACE_IMPLS = ("fla_gdn",)  # reads the state, writes a fresh fp32 state
IMPLS = ("replay", "baseline", "flashinfer_ssu", "flashinfer_checkpointing_ssu", "mamba_ssm_ssu", "fla_gdn", "fla_kda",
         "fla_gdn_pooled")


def checkpointing_ssu_bytes(shape: BenchShape, state_dtype: str, window: int) -> float:
    """FlashInfer ``checkpointing_ssu``, single-token decode, ring R = window + 1, averaged over its W-step cycle.

    With the caller's tracker rule the replayed count runs 1 .. W: every step reads S and that many records (mean
    (W+1)/2) and appends the new token; the step at W flushes (writes S).
    """
    if not isinstance(window, int) or window < 1:
        raise ValueError(f"window: expected an int >= 1, got {window!r}")
    s, rec = core.state_bytes(shape.dims, state_dtype), core.record_bytes(shape.dims, ACT_DTYPE)
    return s + rec * (window + 1) / 2 + rec + s / window + core.io_bytes(shape.dims, ACT_DTYPE)


def step_bytes(impl: str, shape: BenchShape, state_dtype: core.StateLike, buffer_len: int,
               mode: str | None = None) -> float:
    """Bytes per decode step per sequence for ``impl``; ``mode`` (what our op ran: ``replay``, ``fused`` or ``flush``)
    only for ours (the one-launch replay moves the replay's bytes)."""
    d = shape.dims
    if impl == "replay":
        if mode not in ("replay", "fused", "flush"):
            raise ValueError(f"mode: expected a resolved mode 'replay', 'fused' or 'flush' for impl 'replay', "
                             f"got {mode!r}")
        if mode in ("replay", "fused"):
            return core.replay_bytes(d, state_dtype, ACT_DTYPE, buffer_len)
        return core.baseline_bytes(d, state_dtype, ACT_DTYPE)
    if impl in BASELINE_IMPLS:
        return core.baseline_bytes(d, state_dtype, ACT_DTYPE)
    if impl in OUT_OF_PLACE_IMPLS:
        return core.state_bytes(d, state_dtype) + core.state_bytes(d, "fp32") + core.io_bytes(d, ACT_DTYPE)
    if impl == "flashinfer_checkpointing_ssu":
        return checkpointing_ssu_bytes(shape, state_dtype, buffer_len)
    raise ValueError(f"impl: expected one of {IMPLS}, got {impl!r}")
