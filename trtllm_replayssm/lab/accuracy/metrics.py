"""Per-token comparison of two next-token distributions and its summaries, in float64."""
from __future__ import annotations

import math

import torch

F64 = torch.float64


def token_metrics(ref_logits: torch.Tensor, test_logits: torch.Tensor,
                  targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """For logits ``[n, vocab]`` of the reference and the test and the tokens that followed ``[n]``: KL(ref ‖ test),
    the reference's and the test's negative log-likelihood of the target, and whether both argmaxes agree (each
    ``[n]``)."""
    ref = torch.log_softmax(ref_logits.to(F64), -1)
    test = torch.log_softmax(test_logits.to(F64), -1)
    kl = (ref.exp() * (ref - test)).sum(-1).clamp_min(0.0)
    idx = targets.long()[:, None]
    return kl, -ref.gather(-1, idx)[:, 0], -test.gather(-1, idx)[:, 0], ref.argmax(-1) == test.argmax(-1)


def segment_records(kl: torch.Tensor, nll_ref: torch.Tensor, nll_test: torch.Tensor, agree: torch.Tensor,
                    first: int, positions: list[int]) -> list[dict]:
    """One summary per position p: the predictions of tokens ``prev .. p - 1`` (``prev``: the previous position,
    ``first`` for the first one), where index i of the per-token tensors predicts token ``first + i``."""
    out = []
    start = first
    for p in positions:
        a, b = start - first, p - first
        seg = kl[a:b]
        ppl, ppl_ref = math.exp(nll_test[a:b].mean().item()), math.exp(nll_ref[a:b].mean().item())
        out.append({"position": p, "from_position": start, "predicted_tokens": b - a,
                    "mean_kl": seg.mean().item(), "p99_kl": torch.quantile(seg, 0.99).item(),
                    "ppl": ppl, "ppl_ref": ppl_ref, "delta_ppl_pct": 100.0 * (ppl / ppl_ref - 1.0),
                    "greedy_agreement": agree[a:b].to(F64).mean().item()})
        start = p
    return out


def kl_curve(kl: torch.Tensor, first: int, bins: int = 256) -> dict[str, list[float]]:
    """Mean KL over ``bins`` consecutive windows of predictions (fewer if there are fewer tokens): the window's last
    token position and its mean."""
    chunks = torch.tensor_split(kl, min(bins, kl.numel()))
    ends, means, end = [], [], first
    for c in chunks:
        end += c.numel()
        ends.append(end)
        means.append(c.mean().item())
    return {"position": ends, "mean_kl": means}
