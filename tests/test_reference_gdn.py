"""Gated DeltaNet references: float32 replay vs float64 sequential recurrence, baseline parity, pad rows, bad input."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from delta_rule_harness import (
    Family,
    assert_untouched_outside,
    check_l1_matches_baseline,
    check_pad_rows_untouched,
    make_cache,
    run_replay,
)

from trtllm_replayssm.core.reference import gdn

DIM = 128  # K == V

pytestmark = pytest.mark.usefixtures("no_subnormals")


def gdn_family(
    heads: int = 4, v_heads: int = 8, seed: int = 123, A_log: torch.Tensor | None = None  # noqa: N803
) -> Family:
    """GDN adapter with random per-head parameters (decays from ~e^-0.03 to ~e^-2 per token)."""
    gen = torch.Generator().manual_seed(seed)
    a_log = torch.empty(v_heads).uniform_(-3.0, 1.0, generator=gen) if A_log is None else A_log
    dt_bias = 0.5 * torch.randn(v_heads, generator=gen)

    def draw(batch: int, g: torch.Generator, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {
            "q": torch.randn(batch, heads, DIM, generator=g).to(dtype),
            "k": torch.randn(batch, heads, DIM, generator=g).to(dtype),
            "v": torch.randn(batch, v_heads, DIM, generator=g).to(dtype),
            "a": torch.randn(batch, v_heads, generator=g).to(dtype),
            "b": torch.randn(batch, v_heads, generator=g).to(dtype),
        }

    def sequential(state, x):
        return gdn.sequential_step(state, x["q"], x["k"], x["v"], x["a"], x["b"], a_log, dt_bias)

    def replay(c, x, idx, force_flush, out):
        gdn.replay_step_(
            c.state, c.u_ring, c.k_ring, c.g_ring, c.cursor, x["q"], x["k"], x["v"], x["a"], x["b"], a_log, dt_bias,
            None, idx, -1, force_flush, out,
        )

    def update(state, x, idx, out):
        gdn.state_update_(state, x["q"], x["k"], x["v"], x["a"], x["b"], a_log, dt_bias, None, idx, -1, out)

    return Family(heads, v_heads, DIM, 1, draw, sequential, replay, update)


@pytest.mark.parametrize("ring_len", [1, 8, 16, 32])
def test_replay_matches_float64_over_three_cycles(ring_len: int) -> None:
    warmups = [0, 3, ring_len // 2 + 1]
    stats, cache, info = run_replay(gdn_family(), ring_len, 3 * ring_len + 2, warmups)
    if ring_len > 1:
        assert len(set(info["cursors_at_main"])) == 3  # staggered cursors
    assert min(stats.flushes_per_row.values()) >= 3
    assert max(stats.out_err) < 1e-5
    assert max(stats.flush_state_err) < 1e-5  # checkpoint parity at every flush
    assert_untouched_outside(cache, info)


def test_replay_without_gqa() -> None:
    stats, cache, info = run_replay(gdn_family(heads=4, v_heads=4), 16, 50, [0, 5, 11])
    assert max(stats.out_err) < 1e-5 and max(stats.flush_state_err) < 1e-5
    assert_untouched_outside(cache, info)


def test_force_flush_folds_partial_rings() -> None:
    # forced flushes every 5 steps land at cursors that are not L-1
    stats, _, _ = run_replay(gdn_family(), 16, 40, [0, 3, 9], force_flush_every=5)
    assert len(stats.flush_state_err) >= 3 * 8
    assert max(stats.out_err) < 1e-5 and max(stats.flush_state_err) < 1e-5


# Measured maxima (L=16, 50 steps, 3 rows): bf16 state 2.1e-3 out / 3.1e-3 state, fp16 state 2.7e-4 / 3.9e-4,
# bf16 activations 4.3e-3 / 4.3e-3, fp16 activations 6.0e-4 / 5.3e-4. Bounds leave ~3x headroom.
@pytest.mark.parametrize(
    ("act_dtype", "state_dtype", "bound"),
    [
        (torch.float32, torch.bfloat16, 1e-2),
        (torch.float32, torch.float16, 1.5e-3),
        (torch.bfloat16, torch.float32, 1.5e-2),
        (torch.float16, torch.float32, 2e-3),
        (torch.bfloat16, torch.bfloat16, 2e-2),
    ],
)
def test_low_precision_bounds(act_dtype: torch.dtype, state_dtype: torch.dtype, bound: float) -> None:
    stats, cache, info = run_replay(gdn_family(), 16, 50, [0, 5, 11], act_dtype=act_dtype, state_dtype=state_dtype)
    assert max(stats.out_err) < bound and max(stats.flush_state_err) < bound
    assert_untouched_outside(cache, info)


@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_l1_is_the_baseline_step(state_dtype: torch.dtype) -> None:
    check_l1_matches_baseline(gdn_family(), state_dtype)


def test_pad_rows_untouched() -> None:
    check_pad_rows_untouched(gdn_family())


def test_saturated_gate_stays_finite() -> None:
    # exp(A_log = 100) overflows float32: g = -inf before the floor; the cumulative ring gate must stay finite.
    a_log = torch.tensor([100.0, -1.0, 100.0, 0.0, -2.0, 100.0, 0.5, -3.0])
    stats, cache, _ = run_replay(gdn_family(A_log=a_log), 8, 26, [0, 3, 5])
    assert max(stats.out_err) < 1e-5 and max(stats.flush_state_err) < 1e-5
    assert torch.isfinite(cache.state).all()
    valid = torch.arange(8)[None, :] < cache.cursor[:, None].long()
    assert torch.isfinite(cache.g_ring.permute(0, 2, 1)[valid]).all()


def test_sequential_matches_householder_form() -> None:
    """Ground-truth check: S' = alpha S (I - beta k k^T) + beta v k^T, o = S' (scale q), per value head (GQA)."""
    gen = torch.Generator().manual_seed(7)
    heads, v_heads, dk, dv = 2, 4, 16, 8
    state = torch.randn(3, v_heads, dv, dk, generator=gen, dtype=torch.float64)
    q, k = (torch.randn(3, heads, dk, generator=gen, dtype=torch.float64) for _ in range(2))
    v = torch.randn(3, v_heads, dv, generator=gen, dtype=torch.float64)
    a, b = (torch.randn(3, v_heads, generator=gen, dtype=torch.float64) for _ in range(2))
    a_log, dt_bias = (torch.randn(v_heads, generator=gen, dtype=torch.float64) for _ in range(2))
    out, new_state = gdn.sequential_step(state, q, k, v, a, b, a_log, dt_bias, scale=0.3)
    for n in range(3):
        for hv in range(v_heads):
            h = hv // (v_heads // heads)
            kh = k[n, h] / torch.sqrt(k[n, h].square().sum() + 1e-6)
            qh = q[n, h] / torch.sqrt(q[n, h].square().sum() + 1e-6)
            alpha = math.exp(-math.exp(a_log[hv]) * math.log1p(math.exp(a[n, hv] + dt_bias[hv])))
            beta = 1.0 / (1.0 + math.exp(-b[n, hv]))
            eye = torch.eye(dk, dtype=torch.float64)
            s = alpha * state[n, hv] @ (eye - beta * torch.outer(kh, kh)) + beta * torch.outer(v[n, hv], kh)
            torch.testing.assert_close(new_state[n, hv], s, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(out[n, hv], s @ (0.3 * qh), rtol=1e-12, atol=1e-12)


def test_log_gate_softplus_threshold() -> None:
    a = torch.tensor([[-3.0, 0.0, 19.0, 25.0]], dtype=torch.float64)
    a_log = torch.tensor([0.1, -0.5, 0.3, 1.2], dtype=torch.float64)
    dt_bias = torch.tensor([0.2, 0.0, 0.5, 1.0], dtype=torch.float64)
    x = a + dt_bias
    expected = -torch.exp(a_log) * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    torch.testing.assert_close(gdn.log_gate(a, a_log, dt_bias), expected, rtol=1e-14, atol=0)
    torch.testing.assert_close(gdn.log_gate(a, a_log, dt_bias), -torch.exp(a_log) * F.softplus(x), rtol=1e-14, atol=0)


# ------------------------------------------------------------------------------------------------------------ bad input
def _args(slots: int = 4, ring_len: int = 4) -> dict[str, object]:
    fam = gdn_family(heads=2, v_heads=4)
    gen = torch.Generator().manual_seed(0)
    c = make_cache(fam, slots, ring_len, torch.float32, torch.float32, gen)
    x = fam.draw(2, gen, torch.float32)
    return {
        "state": c.state, "u_ring": c.u_ring, "k_ring": c.k_ring, "g_ring": c.g_ring, "cursor": c.cursor,
        "q": x["q"], "k": x["k"], "v": x["v"], "a": x["a"], "b": x["b"], "A_log": torch.zeros(4),
        "dt_bias": torch.zeros(4), "scale": None, "state_batch_indices": torch.tensor([0, 2], dtype=torch.int32),
        "pad_slot_id": -1, "force_flush": False, "out": torch.empty(2, 4, DIM),
    }


@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        ("cursor", torch.zeros(4, dtype=torch.int64), TypeError, "cursor"),
        ("cursor", torch.tensor([0, 0, 4, 0], dtype=torch.int32), ValueError, "cursor"),
        ("g_ring", torch.zeros(4, 4, 4, DIM), ValueError, "g_ring"),
        ("g_ring", torch.zeros(4, 4, 4, dtype=torch.bfloat16), TypeError, "g_ring"),
        ("k_ring", torch.zeros(4, 2, 4, DIM, dtype=torch.bfloat16), TypeError, "k_ring"),
        ("u_ring", torch.zeros(4, 4, 0, DIM), ValueError, "u_ring"),
        ("k", torch.zeros(2, 2, DIM, dtype=torch.float16), TypeError, "k"),
        ("v", torch.zeros(2, 3, DIM), ValueError, "v"),
        ("A_log", torch.zeros(2), ValueError, "A_log"),
        ("state", torch.zeros(4, 4, DIM, DIM, dtype=torch.float64), TypeError, "state"),
        ("state_batch_indices", torch.tensor([0, 2]), TypeError, "state_batch_indices"),
        ("state_batch_indices", torch.tensor([1, 1], dtype=torch.int32), ValueError, "state_batch_indices"),
        ("state_batch_indices", torch.tensor([0, 4], dtype=torch.int32), ValueError, "state_batch_indices"),
        ("out", torch.empty(2, 4, DIM + 1), ValueError, "out"),
        ("scale", "0.1", TypeError, "scale"),
        ("force_flush", 1, TypeError, "force_flush"),
        ("pad_slot_id", -1.0, TypeError, "pad_slot_id"),
        ("q", [1.0], TypeError, "q"),
    ],
)
def test_replay_rejects_bad_input(name: str, value: object, error: type[Exception], match: str) -> None:
    args = _args()
    state, cursor = args["state"], args["cursor"]
    snapshot = (state.clone(), cursor.clone())
    args[name] = value
    with pytest.raises(error, match=f"^{match}:"):
        gdn.replay_step_(**args)
    assert torch.equal(state, snapshot[0]) and torch.equal(cursor, snapshot[1])  # nothing written before the error


def test_state_update_rejects_bad_input() -> None:
    args = _args()
    base = {k: args[k] for k in ("state", "q", "k", "v", "a", "b", "A_log", "dt_bias", "scale",
                                 "state_batch_indices", "pad_slot_id", "out")}
    with pytest.raises(ValueError, match="^dt_bias:"):
        gdn.state_update_(**{**base, "dt_bias": torch.zeros(4, 1)})
    with pytest.raises(TypeError, match="^a:"):
        gdn.state_update_(**{**base, "a": torch.zeros(2, 4, dtype=torch.int32)})
