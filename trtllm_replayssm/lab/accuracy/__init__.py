"""Accuracy of a state spec on a (trained) model: teacher-forced decode against an fp32 baseline state, per-token
KL, perplexity and greedy agreement (``trtllm-replayssm accuracy``)."""
from __future__ import annotations

from .metrics import kl_curve, segment_records, token_metrics
from .run import AccuracyConfig, plot_kl, read_tokens, run_accuracy

__all__ = ["kl_curve", "segment_records", "token_metrics", "AccuracyConfig", "plot_kl", "read_tokens", "run_accuracy"]
