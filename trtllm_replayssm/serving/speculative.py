"""Speculative decoding (MTP) in a serving bundle: the draft-token count, the ring a window needs, the
``speculative_config`` TensorRT-LLM reads, and who serves it: the module's MTP verify, or upstream's MTP path
wherever the module refuses the configuration at start-up.

Upstream (TensorRT-LLM ``tensorrt_llm/llmapi/llm_args.py`` @00043967): ``MTPDecodingConfig`` has
``decoding_type: Literal["MTP"]``; the draft count is ``DecodingBaseConfig.max_draft_len`` (> 0 for MTP), and a
verify step carries ``tokens_per_gen_step = 1 + max_total_draft_tokens`` tokens (linear MTP: ``max_total_draft_tokens
= max_draft_len``). At that revision ``num_nextn_predict_layers`` is deprecated: a before-validator moves it to
``max_draft_len`` (dropped when both are given); older releases read only it and derive ``max_draft_len`` from it.
The bundle writes both with the same value, so either reading gives N draft tokens.

Ring size: a verify of ``T`` tokens folds a row's ``count`` committed records into the checkpoint first when this
window and the next might not fit after them (``count + 2T > R``, core/spec_cursor.py ``folds_before``). A ring of
``R = L + T = L + N + 1`` positions therefore folds ``L - T + 1 .. L`` committed records at a time (standard decode's
ring of ``L`` folds ``L``), the ring FlashInfer's ``checkpointing_ssu`` allots a replay window of ``L`` tokens; one
position fewer folds about a quarter more often at T = 4 (docs/decisions.md, speculative rings); ``N = 0`` is the
standard-decode ring.
"""
from __future__ import annotations

from trtllm_replayssm.core.dims import Mamba2Dims
from trtllm_replayssm.serving.presets import ModelSpec

MAX_SPEC_TOKENS = 7  # windows of T = N + 1 <= 8 tokens (issue 24's verify bound)
TMA_TILE_ROWS = 32  # row tile of upstream's TMA state stores in its Mamba-2 MTP replay (issue 24)
ALLOW_FLAG = "--allow-upstream-mtp"
SERVED_BY = "ReplaySSM MTP verify"  # the manifest's speculative.served_by
VERIFY_NOTE = ("the module verifies each MTP window from checkpoint + ring in every SSM layer (no per-draft "
               "state) and commits the accepted counts in place of TensorRT-LLM's update_mamba_states; a configuration "
               "it refuses at start-up (logged: another decoding type, a draft count other than the bundle's, "
               "TensorRT-LLM's own MTP replay switched on, ...) runs upstream's MTP path in every SSM layer. Not yet "
               "run inside TensorRT-LLM")


def check_spec_tokens(spec_tokens: int | None) -> int | None:
    """``spec_tokens`` (draft tokens N per verify step, 1..MAX_SPEC_TOKENS, or None: no speculative decoding) or a
    ValueError naming it."""
    if spec_tokens is None:
        return None
    if isinstance(spec_tokens, bool) or not isinstance(spec_tokens, int) or not 1 <= spec_tokens <= MAX_SPEC_TOKENS:
        raise ValueError(f"spec_tokens: expected 1 to {MAX_SPEC_TOKENS} draft tokens per verify step, "
                         f"got {spec_tokens!r}")
    return spec_tokens


def ring_len(buffer_len: int, spec_tokens: int | None) -> int:
    """Ring positions per slot for ring length ``buffer_len`` (L) and windows of ``spec_tokens + 1`` tokens:
    L + N + 1 (module docstring); L without speculative decoding."""
    n = check_spec_tokens(spec_tokens)
    return buffer_len if n is None else buffer_len + n + 1


def speculative_config(spec_tokens: int) -> dict[str, object]:
    """The YAML's ``speculative_config`` for MTP with ``spec_tokens`` draft tokens (keys: module docstring)."""
    n = check_spec_tokens(spec_tokens)
    if n is None:
        raise ValueError("spec_tokens: speculative_config needs a draft-token count")
    return {"decoding_type": "MTP", "max_draft_len": n, "num_nextn_predict_layers": n}


def upstream_mtp_hazard(spec: ModelSpec) -> str | None:
    """Why upstream's Mamba-2 MTP replay is not safe for ``spec``, or None: its TMA state stores use 32-row tiles
    without a row mask, so a head_dim that is not a multiple of 32 lets the last tile overwrite the next head's rows
    (issue 24, measured on an H200 with head_dim 80 and fp32 state)."""
    dims = spec.ssm_dims
    if not isinstance(dims, Mamba2Dims) or dims.head_dim % TMA_TILE_ROWS == 0:
        return None
    return (f"{spec.name} has Mamba-2 head_dim {dims.head_dim}, not a multiple of {TMA_TILE_ROWS}: upstream "
            f"TensorRT-LLM's Mamba-2 MTP replay (what serves speculative decoding where the module refuses the "
            f"configuration at start-up; the module's own verify has not run inside TensorRT-LLM yet) stores state in "
            f"{TMA_TILE_ROWS}-row TMA tiles without a row mask and overwrites rows of the next head (measured with "
            f"head_dim 80 and fp32 state: outputs off by ~0.19 relative after 24 verify steps; other state dtypes "
            f"not measured)")


def upstream_mtp_warning(spec: ModelSpec, spec_tokens: int | None, allow: bool) -> str | None:
    """The warning a build with ``spec_tokens`` must print for ``spec`` (None: nothing to warn about); a ValueError
    naming ``spec_tokens`` where upstream's MTP fallback is not safe for the model and ``allow`` is not set."""
    hazard = upstream_mtp_hazard(spec) if check_spec_tokens(spec_tokens) else None
    if hazard and not allow:
        raise ValueError(f"spec_tokens: refusing to build: {hazard}; pass {ALLOW_FLAG} to build it anyway, or build "
                         f"without --spec-tokens")
    return hazard
