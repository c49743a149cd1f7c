"""KDA references: float32 replay vs float64 sequential recurrence, gate forms, baseline parity, bad input."""
from __future__ import annotations

import pytest
import torch
from delta_rule_harness import (
    Family,
    assert_untouched_outside,
    check_l1_matches_baseline,
    check_pad_rows_untouched,
    make_cache,
    run_replay,
)

from trtllm_replayssm.core.reference import kda
from trtllm_replayssm.core.reference.gdn import PREDECAY_FLOOR

DIM = 128  # K == V

pytestmark = pytest.mark.usefixtures("no_subnormals")


def kda_family(
    heads: int = 8, v_heads: int = 8, seed: int = 321, lower_bound: float | None = None, gate_scale: float = 1.0,
    v_scale: float = 1.0, A_log: torch.Tensor | None = None,  # noqa: N803
) -> Family:
    """KDA adapter with random per-head ``A_log`` and per-channel ``dt_bias`` (flattened ``[HV*K]`` like fla-core)."""
    gen = torch.Generator().manual_seed(seed)
    a_log = torch.empty(v_heads).uniform_(-3.0, 1.0, generator=gen) if A_log is None else A_log
    dt_bias = 0.5 * torch.randn(v_heads * DIM, generator=gen)

    def draw(batch: int, g: torch.Generator, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        return {
            "q": torch.randn(batch, heads, DIM, generator=g).to(dtype),
            "k": torch.randn(batch, heads, DIM, generator=g).to(dtype),
            "v": (v_scale * torch.randn(batch, v_heads, DIM, generator=g)).to(dtype),
            "g_raw": (gate_scale * torch.randn(batch, v_heads, DIM, generator=g)).to(dtype),
            "beta_raw": torch.randn(batch, v_heads, generator=g).to(dtype),
        }

    def sequential(state, x):
        return kda.sequential_step(
            state, x["q"], x["k"], x["v"], x["g_raw"], x["beta_raw"], a_log, dt_bias, lower_bound
        )

    def replay(c, x, idx, force_flush, out):
        kda.replay_step_(
            c.state, c.u_ring, c.k_ring, c.g_ring, c.cursor, x["q"], x["k"], x["v"], x["g_raw"], x["beta_raw"],
            a_log, dt_bias, lower_bound, None, idx, -1, force_flush, out,
        )

    def update(state, x, idx, out):
        kda.state_update_(
            state, x["q"], x["k"], x["v"], x["g_raw"], x["beta_raw"], a_log, dt_bias, lower_bound, None, idx, -1, out
        )

    return Family(heads, v_heads, DIM, DIM, draw, sequential, replay, update)


@pytest.mark.parametrize("lower_bound", [None, -5.0])
@pytest.mark.parametrize("ring_len", [1, 8, 16, 32])
def test_replay_matches_float64_over_three_cycles(ring_len: int, lower_bound: float | None) -> None:
    warmups = [0, 3, ring_len // 2 + 1]
    stats, cache, info = run_replay(kda_family(lower_bound=lower_bound), ring_len, 3 * ring_len + 2, warmups)
    if ring_len > 1:
        assert len(set(info["cursors_at_main"])) == 3  # staggered cursors
    assert min(stats.flushes_per_row.values()) >= 3
    assert max(stats.out_err) < 1e-5
    assert max(stats.flush_state_err) < 1e-5  # checkpoint parity at every flush
    assert_untouched_outside(cache, info)


def test_replay_with_grouped_value_heads() -> None:
    stats, cache, info = run_replay(kda_family(heads=2, v_heads=4), 16, 40, [0, 5, 11])
    assert max(stats.out_err) < 1e-5 and max(stats.flush_state_err) < 1e-5
    assert_untouched_outside(cache, info)


def test_force_flush_folds_partial_rings() -> None:
    stats, _, _ = run_replay(kda_family(lower_bound=-5.0), 16, 40, [0, 3, 9], force_flush_every=5)
    assert len(stats.flush_state_err) >= 3 * 8
    assert max(stats.out_err) < 1e-5 and max(stats.flush_state_err) < 1e-5


def test_strong_decay_no_overflow() -> None:
    # Saturated safe gate: g ~ -5 on most channels; over a 32-entry ring the cumulative gate passes e^-103 (float32
    # underflow). Exponents e^{G - G_j} stay <= 0, so nothing overflows; large values stress the fold.
    fam = kda_family(lower_bound=-5.0, gate_scale=20.0, v_scale=100.0, A_log=torch.full((8,), 1.5))
    stats, cache, info = run_replay(fam, 32, 4 * 32 - 1, [0, 3, 17])  # row 0 ends with a full ring (cursor 31)
    assert int(cache.cursor[info["row_slots"][0]]) == 31 and min(stats.flushes_per_row.values()) >= 3
    assert max(stats.out_err) < 1e-5 and max(stats.flush_state_err) < 1e-5
    assert torch.isfinite(cache.state).all()
    valid = torch.arange(32)[None, :] < cache.cursor[:, None].long()
    g_valid = cache.g_ring.permute(0, 2, 1, 3)[valid]
    assert torch.isfinite(g_valid).all() and g_valid.min() < -103.0
    entry_min = g_valid.amin(-1)  # both key forms in the rings: pre-decayed (G_j >= -64 everywhere) and raw
    assert (entry_min >= -PREDECAY_FLOOR).any() and (entry_min < -PREDECAY_FLOOR).any()
    k_valid = cache.k_ring.permute(0, 2, 1, 3)[valid]
    assert torch.isfinite(k_valid).all() and k_valid.abs().max() > 1e3  # pre-decayed keys grow as e^{-G_j}
    assert_untouched_outside(cache, info)


def test_saturated_plain_gate_stays_finite() -> None:
    # exp(A_log = 100) overflows float32: g = -inf before the floor; the cumulative ring gate must stay finite.
    a_log = torch.tensor([100.0, -1.0, 100.0, 0.0, -2.0, 100.0, 0.5, -3.0])
    stats, cache, _ = run_replay(kda_family(A_log=a_log), 8, 26, [0, 3, 5])
    assert max(stats.out_err) < 1e-5 and max(stats.flush_state_err) < 1e-5
    assert torch.isfinite(cache.state).all()


# Measured maxima (L=16, 40 steps, 3 rows): bf16 state 2.2e-3 out / 2.9e-3 state, fp16 state 2.6e-4 / 3.8e-4,
# bf16 activations 4.6e-3 / 3.4e-3, fp16 activations 6.4e-4 / 4.8e-4. Bounds leave ~3x headroom.
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
    stats, cache, info = run_replay(kda_family(), 16, 40, [0, 5, 11], act_dtype=act_dtype, state_dtype=state_dtype)
    assert max(stats.out_err) < bound and max(stats.flush_state_err) < bound
    assert_untouched_outside(cache, info)


@pytest.mark.parametrize("lower_bound", [None, -5.0])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_l1_is_the_baseline_step(state_dtype: torch.dtype, lower_bound: float | None) -> None:
    check_l1_matches_baseline(kda_family(lower_bound=lower_bound), state_dtype)


def test_pad_rows_untouched() -> None:
    check_pad_rows_untouched(kda_family())


def test_sequential_matches_key_major_loop() -> None:
    """Ground-truth check against fla-core's [K, V] state orientation, written out per channel."""
    gen = torch.Generator().manual_seed(5)
    heads, v_heads, dk, dv = 2, 4, 16, 8
    f64 = torch.float64
    state = torch.randn(2, v_heads, dv, dk, generator=gen, dtype=f64)
    q, k = (torch.randn(2, heads, dk, generator=gen, dtype=f64) for _ in range(2))
    v = torch.randn(2, v_heads, dv, generator=gen, dtype=f64)
    g_raw = torch.randn(2, v_heads, dk, generator=gen, dtype=f64)
    beta_raw = torch.randn(2, v_heads, generator=gen, dtype=f64)
    a_log, dt_bias = torch.randn(v_heads, generator=gen, dtype=f64), torch.randn(v_heads, dk, generator=gen, dtype=f64)
    for lower_bound in (None, -3.0):
        out, new_state = kda.sequential_step(state, q, k, v, g_raw, beta_raw, a_log, dt_bias, lower_bound, scale=0.7)
        for n in range(2):
            for hv in range(v_heads):
                h = hv // (v_heads // heads)
                h_kv = state[n, hv].T.clone()  # [K, V]
                kh = k[n, h] / (k[n, h].square().sum() + 1e-6).sqrt()
                qh = q[n, h] / (q[n, h].square().sum() + 1e-6).sqrt() * 0.7
                x = g_raw[n, hv] + dt_bias[hv]
                if lower_bound is None:
                    gate = -a_log[hv].exp() * torch.log1p(x.exp())
                else:
                    gate = lower_bound / (1.0 + torch.exp(-a_log[hv].exp() * x))
                h_kv = h_kv * gate.exp()[:, None]
                u = torch.sigmoid(beta_raw[n, hv]) * (v[n, hv] - (h_kv * kh[:, None]).sum(0))
                h_kv = h_kv + kh[:, None] * u[None, :]
                torch.testing.assert_close(new_state[n, hv], h_kv.T, rtol=1e-12, atol=1e-12)
                torch.testing.assert_close(out[n, hv], (h_kv * qh[:, None]).sum(0), rtol=1e-12, atol=1e-12)


def test_log_gate_forms() -> None:
    gen = torch.Generator().manual_seed(3)
    g_raw = 4.0 * torch.randn(5, 3, 16, generator=gen, dtype=torch.float64)
    a_log = torch.randn(3, generator=gen, dtype=torch.float64)
    dt_bias = torch.randn(3, 16, generator=gen, dtype=torch.float64)
    flat = kda.log_gate(g_raw, a_log, dt_bias.reshape(-1), -5.0)
    torch.testing.assert_close(kda.log_gate(g_raw, a_log, dt_bias, -5.0), flat, rtol=0, atol=0)
    assert (flat > -5.0).all() and (flat < 0.0).all()
    plain = kda.log_gate(g_raw, a_log, dt_bias)
    x = g_raw + dt_bias
    expected = -a_log.exp()[:, None] * torch.where(x > 20, x, torch.log1p(torch.exp(x)))
    torch.testing.assert_close(plain, expected, rtol=1e-14, atol=0)


# ------------------------------------------------------------------------------------------------------------ bad input
def _args() -> dict[str, object]:
    fam = kda_family(heads=2, v_heads=2)
    gen = torch.Generator().manual_seed(0)
    c = make_cache(fam, 4, 4, torch.float32, torch.float32, gen)
    x = fam.draw(2, gen, torch.float32)
    return {
        "state": c.state, "u_ring": c.u_ring, "k_ring": c.k_ring, "g_ring": c.g_ring, "cursor": c.cursor,
        "q": x["q"], "k": x["k"], "v": x["v"], "g_raw": x["g_raw"], "beta_raw": x["beta_raw"],
        "A_log": torch.zeros(2), "dt_bias": torch.zeros(2, DIM), "lower_bound": -5.0, "scale": None,
        "state_batch_indices": torch.tensor([0, 2], dtype=torch.int32), "pad_slot_id": -1, "force_flush": False,
        "out": torch.empty(2, 2, DIM),
    }


@pytest.mark.parametrize(
    ("name", "value", "error", "match"),
    [
        ("lower_bound", 0.5, ValueError, "lower_bound"),
        ("lower_bound", float("-inf"), ValueError, "lower_bound"),
        ("lower_bound", "low", TypeError, "lower_bound"),
        ("g_ring", torch.zeros(4, 2, 4), ValueError, "g_ring"),  # the GDN (per-head) ring
        ("g_raw", torch.zeros(2, 2), ValueError, "g_raw"),
        ("dt_bias", torch.zeros(2), ValueError, "dt_bias"),
        ("dt_bias", None, TypeError, "dt_bias"),
        ("beta_raw", torch.zeros(2, 2, 1), ValueError, "beta_raw"),
        ("cursor", torch.tensor([3, 0, 7, 0], dtype=torch.int32), ValueError, "cursor"),
        ("state_batch_indices", torch.tensor([2, 2], dtype=torch.int32), ValueError, "state_batch_indices"),
    ],
)
def test_replay_rejects_bad_input(name: str, value: object, error: type[Exception], match: str) -> None:
    args = _args()
    state, cursor = args["state"], args["cursor"]
    snapshot = (state.clone(), cursor.clone())
    args[name] = value
    with pytest.raises(error, match=f"^{match}:"):
        kda.replay_step_(**args)
    assert torch.equal(state, snapshot[0]) and torch.equal(cursor, snapshot[1])  # nothing written before the error
