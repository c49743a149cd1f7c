"""Limits shared by the kernels, the state cache, the planner, the memory plan and the CLI (no torch import).

Each number is also a constant of plugins/replayssm_common.cuh; compiling a kernel asserts that the two agree
(core/layouts.py common_checks).
"""
from __future__ import annotations

MAX_BUFFER_LEN = 32  # ring length L: one ring entry per lane in the kernels' warp scans (kMaxL)
NUM_WARPS = 4        # warps per CTA of every decode kernel; the persistent kernels add one producer warp (kNumWarps)
MAX_STAGES = 8       # shared-memory stages of a persistent replay kernel (kMaxStages)
MAX_WINDOW = 8       # tokens per speculative verify window, T = 1 + drafts (kMaxWindow)
MODES = ("auto", "replay", "fused", "flush")  # the modes a replay op's caller asks for (core/plans.py resolve_mode)


def check_buffer_len(buffer_len: object) -> int:
    """``buffer_len`` if it is an int in [1, MAX_BUFFER_LEN]; ValueError naming the argument otherwise."""
    if isinstance(buffer_len, bool) or not isinstance(buffer_len, int) or not 1 <= buffer_len <= MAX_BUFFER_LEN:
        raise ValueError(f"buffer_len: expected an integer in [1, {MAX_BUFFER_LEN}], got {buffer_len!r}")
    return buffer_len
