"""Limits shared by the kernels, the state cache, the memory plan and the CLI (no torch import)."""
from __future__ import annotations

# Ring length L: one ring entry per lane in the kernels' warp scans (plugins/replayssm_common.cuh, kMaxL).
MAX_BUFFER_LEN = 32


def check_buffer_len(buffer_len: object) -> int:
    """``buffer_len`` if it is an int in [1, MAX_BUFFER_LEN]; ValueError naming the argument otherwise."""
    if isinstance(buffer_len, bool) or not isinstance(buffer_len, int) or not 1 <= buffer_len <= MAX_BUFFER_LEN:
        raise ValueError(f"buffer_len: expected an integer in [1, {MAX_BUFFER_LEN}], got {buffer_len!r}")
    return buffer_len
