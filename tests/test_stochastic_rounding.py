"""Stochastic rounding (core/quant.py): Philox4x32-10 against the Random123 known answers and a pure-Python Philox,
the uniforms' counter / key layout, determinism and batch independence, the rounding rule against the neighbours
taken from the format tables (every neighbour pair at its quarter points, subnormals, binade edges, saturation, NaN,
signs), its statistics, and the SR quantizers."""
from __future__ import annotations

import math

import pytest
import torch

from trtllm_replayssm.core import quant

M32 = 0xFFFFFFFF
ONE_MINUS = 1.0 - 2.0 ** -24  # the largest uniform


def _philox_py(counter: tuple[int, ...], key: tuple[int, ...]) -> tuple[int, ...]:
    """Philox4x32-10 on Python ints, straight from Random123's philox.h."""
    c, (k0, k1) = list(counter), key
    for r in range(10):
        if r:
            k0, k1 = (k0 + 0x9E3779B9) & M32, (k1 + 0xBB67AE85) & M32
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [(p1 >> 32) ^ c[1] ^ k0, p1 & M32, (p0 >> 32) ^ c[3] ^ k1, p0 & M32]
    return tuple(c)


KATS = [((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
         (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1))]


def _i64(*values: int) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int64)


def test_philox_known_answers_and_reference():
    for counter, key, expected in KATS:
        assert _philox_py(counter, key) == expected
        assert tuple(quant.philox4x32_10(_i64(*counter), _i64(*key)).tolist()) == expected
    gen = torch.Generator().manual_seed(0)
    counters = torch.randint(0, 2 ** 32, (64, 4), generator=gen, dtype=torch.int64)
    keys = torch.randint(0, 2 ** 32, (64, 2), generator=gen, dtype=torch.int64)
    got = quant.philox4x32_10(counters, keys)
    assert got.dtype == torch.int64 and got.shape == (64, 4)
    assert got.tolist() == [list(_philox_py(tuple(c), tuple(k))) for c, k in zip(counters.tolist(), keys.tolist())]
    # broadcasting: keys [3, 1, 2] against counters [5, 4]
    got = quant.philox4x32_10(counters[:5], keys[:3, None])
    assert got.shape == (3, 5, 4)
    assert got[2, 4].tolist() == list(_philox_py(tuple(counters[4].tolist()), tuple(keys[2].tolist())))


def _uniform_py(e: int, slot: int, flushes: int, seed: int, stream: int) -> float:
    word = _philox_py((e >> 2 & M32, e >> 34, stream, seed), (slot, flushes))[e & 3]
    return (word >> 8) * 2.0 ** -24


def test_sr_uniforms_layout():
    slot, flushes, seed, stream = _i64(0, 7, 2 ** 32 - 1), _i64(3, 0, 2 ** 31 + 5), 0xDEADBEEF, 1
    u = quant.sr_uniforms((3, 5, 7), slot, flushes, seed, stream)  # 35 elements per row: the last call half used
    assert u.shape == (3, 5, 7) and u.dtype == torch.float32
    flat = u.flatten(1).tolist()
    for i in range(3):
        assert flat[i] == [_uniform_py(e, int(slot[i]), int(flushes[i]), seed, stream) for e in range(35)]
    index = torch.arange(35).expand(3, 35)
    assert torch.equal(quant.sr_uniforms_at(index, slot, flushes, seed, stream), u.flatten(1))
    # element indices beyond 2^32 (the high counter word) without allocating them
    big = _i64(2 ** 32, 2 ** 32 + 5, 2 ** 40 - 1, 3 * 2 ** 36 + 2, 2 ** 34 + 4)
    got = quant.sr_uniforms_at(torch.stack((big, big.flip(0))), slot[:2], flushes[:2], seed, stream)
    assert got[0].tolist() == [_uniform_py(e, 0, 3, seed, stream) for e in big.tolist()]
    assert got[1].tolist() == [_uniform_py(e, 7, 0, seed, stream) for e in big.flip(0).tolist()]
    lo_hi = quant.sr_uniforms_at(_i64(4, 2 ** 34 + 4)[None], slot[:1], flushes[:1], seed, stream)[0]
    assert lo_hi[0] != lo_hi[1]  # q = 1 and q = 2^32 + 1: the high word counts


def test_sr_uniforms_streams_determinism_and_batch_independence():
    shape = (4, 2, 512)
    slot, flushes = _i64(0, 1, 2, 3), _i64(0, 0, 0, 1)
    u = quant.sr_uniforms(shape, slot, flushes, 11, 0)
    assert torch.equal(u, quant.sr_uniforms(shape, slot.clone(), flushes.clone(), 11, 0))
    assert ((u >= 0) & (u < 1)).all() and torch.equal(u * 2 ** 24, (u * 2 ** 24).round())
    assert abs(float(u.mean()) - 0.5) < 0.01 and abs(float(u.var()) - 1 / 12) < 0.005
    variants = [u[i] for i in range(4)] + [quant.sr_uniforms(shape, slot, flushes, 12, 0)[0],
                                           quant.sr_uniforms(shape, slot, flushes, 11, 1)[0],
                                           quant.sr_uniforms(shape, slot, flushes + 1, 11, 0)[0]]
    for i, a in enumerate(variants):  # slot, flushes, seed and stream each pick another sequence
        for b in variants[i + 1:]:
            assert (a != b).float().mean() > 0.99
    sub = quant.sr_uniforms((2, 2, 512), slot[[3, 1]], flushes[[3, 1]], 11, 0)
    assert torch.equal(sub, u[[3, 1]])


# ---------------------------------------------------------------------------------------------------- rounding
def _magnitudes(fmt: str) -> torch.Tensor:
    """Every finite non-negative value of ``fmt``, ascending, from the codes (float64)."""
    if fmt == "e2m1":
        return torch.tensor(quant.E2M1_VALUES, dtype=torch.float64)
    dtype = quant.SR_FORMATS[fmt]
    top = {"fp16": 0x7C00, "bf16": 0x7F80, "e4m3": 0x7F}[fmt]
    itype = torch.int16 if dtype.itemsize == 2 else torch.int8
    return torch.arange(top).to(itype).view(dtype).double()


def _value(y: torch.Tensor, fmt: str) -> torch.Tensor:
    return quant.e2m1_decode(y) if fmt == "e2m1" else y.float()


def _expected(x: torch.Tensor, u: torch.Tensor, fmt: str) -> torch.Tensor:
    """The rule with lo / hi found in the table (finite in-range x)."""
    table = _magnitudes(fmt)
    a = x.double().abs()
    i = torch.searchsorted(table, a, right=True) - 1
    lo, hi = table[i], table[(i + 1).clamp(max=len(table) - 1)]
    p = torch.where(a > lo, (a - lo) / (hi - lo), 0.0)
    return torch.where(u.double() < p, hi, lo).copysign(x.double()).float()


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal values, signs of zeros and NaN positions."""
    return bool(((a == b) | (a.isnan() & b.isnan())).all() and torch.equal(a.signbit(), b.signbit()))


@pytest.mark.parametrize("fmt", list(quant.SR_FORMATS))
def test_representable_values_never_change(fmt):
    table = _magnitudes(fmt).float()
    x = torch.cat((table, -table))
    y_rn = quant.e2m1_decode(quant.e2m1_codes(x)) if fmt == "e2m1" else x.to(quant.SR_FORMATS[fmt]).float()
    assert _same(y_rn, x)
    for u in (0.0, 0.5, ONE_MINUS):
        y = quant.round_stochastic(x, fmt, torch.full_like(x, u))
        assert y.dtype == quant.SR_FORMATS[fmt] and _same(_value(y, fmt), x)


@pytest.mark.parametrize("fmt", list(quant.SR_FORMATS))
def test_every_neighbour_pair_at_quarter_points(fmt):
    """Between every pair of neighbours (subnormals and binade edges included), at lo + k/4 (hi - lo): u = 0 and u
    just below p = k/4 give hi, u = p, just above it and the largest uniform give lo."""
    table = _magnitudes(fmt)
    lo, hi = table[:-1], table[1:]
    for k in (1, 2, 3):
        x = (lo + k / 4 * (hi - lo)).float()
        assert torch.equal(x.double(), lo + k / 4 * (hi - lo))  # exact in fp32
        for sign in (1.0, -1.0):
            for u, pick_hi in ((0.0, True), (k / 4 - 2.0 ** -24, True), (k / 4, False), (k / 4 + 2.0 ** -24, False),
                               (ONE_MINUS, False)):
                y = _value(quant.round_stochastic(sign * x, fmt, torch.full_like(x, u)), fmt)
                assert torch.equal(y, (sign * (hi if pick_hi else lo)).float()), (k, u)


@pytest.mark.parametrize("fmt", list(quant.SR_FORMATS))
def test_random_inputs_against_the_rule(fmt):
    gen = torch.Generator().manual_seed(3)
    table = _magnitudes(fmt)
    top = float(table[-1])
    # log-uniform magnitudes from well below the smallest subnormal to the largest finite value, random signs
    lo_exp = math.log2(float(table[1])) - 4
    mag = torch.exp2(lo_exp + torch.rand(20000, generator=gen, dtype=torch.float64) * (math.log2(top) - lo_exp))
    x = (mag.clamp(max=top) * torch.where(torch.rand(20000, generator=gen) < 0.5, -1.0, 1.0)).float()
    x[:4] = torch.tensor([0.0, -0.0, top, -top])
    x[4:8] = torch.tensor([torch.finfo(torch.float32).tiny * 2.0 ** -10, -1e-45, 2.0 ** -126, 1e-30])  # fp32 subnormal
    u = torch.randint(0, 2 ** 24, x.shape, generator=gen).float() * 2.0 ** -24
    assert _same(_value(quant.round_stochastic(x, fmt, u), fmt), _expected(x, u, fmt))


def test_beyond_the_range_nan_and_signs():
    """Beyond the largest finite value fp16 / bf16 round to nearest (to Inf from the midpoint up), E4M3 / E2M1
    saturate, whatever u; NaN as the round-to-nearest codecs."""
    f32_max = torch.finfo(torch.float32).max
    big = torch.tensor([65504.0 + 8, 65520.0, 1e6, 3.3961e38, f32_max, math.inf, math.nan])
    bf16_big = torch.tensor([3.3900e38, 3.3962e38, 3.4e38, f32_max, math.inf, math.nan])
    for u in (0.0, 0.5, ONE_MINUS):
        x, y = torch.cat((big, -big)), torch.cat((bf16_big, -bf16_big))
        assert _same(quant.round_stochastic(x, "fp16", torch.full_like(x, u)).float(), x.half().float())
        assert _same(quant.round_stochastic(y, "bf16", torch.full_like(y, u)).float(), y.bfloat16().float())
        assert _same(quant.round_stochastic(x, "e4m3", torch.full_like(x, u)).float(), quant.e4m3_round(x).float())
        assert torch.equal(quant.round_stochastic(x, "e2m1", torch.full_like(x, u)), quant.e2m1_codes(x))
    assert x.half().float()[:2].tolist() == [65504.0, math.inf] and y.bfloat16().float()[:4].isinf().tolist() == [
        False, True, True, True]
    assert quant.e4m3_round(x).float()[0] == 448.0 and quant.e2m1_codes(x)[0] == 7 and quant.e2m1_codes(x)[6] == 0
    x = torch.tensor([449.0, -460.0, 6.5, -100.0])
    assert quant.round_stochastic(x[:2], "e4m3", torch.zeros(2)).float().tolist() == [448.0, -448.0]
    assert quant.round_stochastic(x[2:], "e2m1", torch.zeros(2)).tolist() == [7, 15]
    z = torch.tensor([-0.0, 0.0])
    for fmt in quant.SR_FORMATS:
        y = quant.round_stochastic(z, fmt, torch.zeros(2))
        assert y.tolist() == [8, 0] if fmt == "e2m1" else y.float().signbit().tolist() == [True, False]
    with pytest.raises(ValueError, match=r"^fmt: expected one of"):
        quant.round_stochastic(z, "e5m2", torch.zeros(2))
    with pytest.raises(ValueError, match=r"^u: expected the shape of x"):
        quant.round_stochastic(z, "fp16", torch.zeros(3))


@pytest.mark.parametrize("fmt,x", [("fp16", 1.0 + 0.3 * 2.0 ** -10), ("fp16", -3e-6), ("bf16", 1.3),
                                   ("bf16", 1e-39), ("e4m3", 0.3), ("e4m3", -0.37 * 2.0 ** -9), ("e4m3", 300.0),
                                   ("e2m1", 0.2), ("e2m1", -2.7), ("e2m1", 4.9)])
def test_statistics(fmt, x):
    n = 20000
    u = quant.sr_uniforms((1, n), _i64(5), _i64(17), 1234, 0)[0]
    xs = torch.full((n,), x)
    y = _value(quant.round_stochastic(xs, fmt, u), fmt).double()
    table = _magnitudes(fmt)
    a = float(xs[0].abs())
    i = int(torch.searchsorted(table, torch.tensor(a, dtype=torch.float64), right=True)) - 1
    lo, hi = float(table[i]), float(table[i + 1])
    p = (a - lo) / (hi - lo)
    assert 0.1 < p < 0.9 and set(y.abs().unique().tolist()) == {lo, hi}
    var = p * (1 - p) * (hi - lo) ** 2
    assert abs(float(y.mean()) - float(xs[0])) < 4 * math.sqrt(var / n)
    assert abs(float(y.var()) / var - 1) < 0.1


# ---------------------------------------------------------------------------------------------------- quantizers
def test_sr_quantizers_are_unbiased_and_keep_rn_scales():
    gen = torch.Generator().manual_seed(4)
    k, x = 1000, torch.randn(2, 64, generator=gen)
    xs = x.expand(k, 2, 64)
    u = quant.sr_uniforms(xs.shape, torch.zeros(k, dtype=torch.int64), torch.arange(k), 99, 0)
    codes_rn, scale_rn = quant.quantize_fp8_rows(xs)
    codes, scale = quant.quantize_fp8_rows(xs, u)
    assert codes.dtype == torch.float8_e4m3fn and torch.equal(scale, scale_rn)
    z = xs / scale[..., None]
    assert torch.equal(codes.view(torch.uint8), quant.round_stochastic(z, "e4m3", u).view(torch.uint8))
    assert torch.equal(codes_rn.view(torch.uint8), quant.e4m3_codes(z))  # u=None: round to nearest as before
    rn_err = (quant.dequantize_fp8_rows(codes_rn, scale_rn)[0] - x).norm()
    sr_bias = (quant.dequantize_fp8_rows(codes, scale).mean(0) - x).norm()
    assert sr_bias < 0.15 * rn_err

    g = quant.nvfp4_global_scale(xs, (-1,))
    packed_rn, bscale_rn = quant.quantize_nvfp4(xs, g)
    packed, bscale = quant.quantize_nvfp4(xs, g, u)
    assert torch.equal(bscale.view(torch.uint8), bscale_rn.view(torch.uint8))
    blocks = xs.unflatten(-1, (4, 16)) / (bscale.float()[..., None] * g[..., None])
    assert torch.equal(packed_rn, quant.pack_nibbles(quant.e2m1_codes(blocks).flatten(-2)))
    assert torch.equal(packed, quant.pack_nibbles(quant.round_stochastic(blocks, "e2m1", u.unflatten(-1, (4, 16)))
                                                  .flatten(-2)))
    rn_err = (quant.dequantize_nvfp4(packed_rn, bscale_rn, g)[0] - x).norm()
    sr_bias = (quant.dequantize_nvfp4(packed, bscale, g).mean(0) - x).norm()
    assert sr_bias < 0.15 * rn_err


def test_sr_quantizers_non_finite_rows_and_to_dtype_rounded():
    x = torch.randn(3, 32)
    x[0, 5], x[1, 20] = math.nan, math.inf
    u = torch.rand(3, 32)
    y = quant.dequantize_fp8_rows(*quant.quantize_fp8_rows(x, u))
    assert y[:2].isnan().all() and torch.isfinite(y[2]).all()
    g = quant.nvfp4_global_scale(x, (-1,))
    y = quant.dequantize_nvfp4(*quant.quantize_nvfp4(x, g, u), g)
    assert y[0, :16].isnan().all() and y[1, 16:].isnan().all() and torch.isfinite(y[2]).all()
    x = torch.randn(4, 40) * 100
    for dtype, fmt in ((torch.float16, "fp16"), (torch.bfloat16, "bf16")):
        assert torch.equal(quant.to_dtype_rounded(x, dtype), x.to(dtype))
        assert torch.equal(quant.to_dtype_rounded(x, dtype, u=torch.zeros_like(x)).float(),
                           quant.round_stochastic(x, fmt, torch.zeros_like(x)).float())
        assert quant.to_dtype_rounded(x, dtype, u=torch.rand(4, 40)).dtype == dtype
    assert torch.equal(quant.to_dtype_rounded(x, torch.float32, u=torch.rand(4, 40)), x)
