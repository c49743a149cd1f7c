"""The quantized-state codecs (core/quant.py) against the format tables, computed here from the bit layouts: every
E4M3 and E2M1 code, round-to-nearest-even at every midpoint, subnormals, saturation, NaN/Inf inputs, nibble order,
and the FP8-row / NVFP4 block quantizers."""
from __future__ import annotations

import math

import pytest
import torch

from trtllm_replayssm.core import quant


def _e4m3_table() -> list[float]:
    """Value of each E4M3 (fn) code from its bits: sign, 4 exponent bits (bias 7), 3 mantissa bits; exponent 0 is
    subnormal; S.1111.111 is NaN; no infinities."""
    out = []
    for code in range(256):
        sign = -1.0 if code & 0x80 else 1.0
        e, m = (code >> 3) & 15, code & 7
        if e == 15 and m == 7:
            out.append(math.nan)
        elif e == 0:
            out.append(sign * m / 8 * 2.0 ** -6)
        else:
            out.append(sign * (1 + m / 8) * 2.0 ** (e - 7))
    return out


def _e2m1_table() -> list[float]:
    out = []
    for code in range(16):
        sign = -1.0 if code & 8 else 1.0
        e, m = (code >> 1) & 3, code & 1
        out.append(sign * (m / 2 if e == 0 else (1 + m / 2) * 2.0 ** (e - 1)))
    return out


def _nearest_even(x: float, table: list[float], max_value: float) -> float:
    """Round-to-nearest, ties to the even code, over the finite non-negative codes, by brute force."""
    mag = min(abs(x), max_value)
    codes = [(abs(v - mag), c & 1, v) for c, v in enumerate(table) if not math.isnan(v) and v >= 0 and c < len(table) // 2]
    best = min(codes)
    return math.copysign(best[2], x)


def test_e4m3_decodes_every_code():
    codes = torch.arange(256, dtype=torch.uint8)
    got = quant.e4m3_decode(codes).tolist()
    for code, (a, b) in enumerate(zip(got, _e4m3_table())):
        assert (math.isnan(a) and math.isnan(b)) or a == b, hex(code)
    assert max(v for v in _e4m3_table() if not math.isnan(v)) == quant.E4M3_MAX == 448.0


def test_e4m3_rounds_to_nearest_even_everywhere():
    table = _e4m3_table()
    finite = sorted({v for v in table if not math.isnan(v) and v >= 0})
    probes = []
    for lo, hi in zip(finite, finite[1:]):
        mid = (lo + hi) / 2
        probes += [lo, mid, math.nextafter(mid, 0), math.nextafter(mid, math.inf)]
    probes += [448.0, 449.0, 464.0, 480.0, 1e6, 2.0 ** -10, 2.0 ** -11, 3 * 2.0 ** -11]
    x = torch.tensor(probes + [-p for p in probes], dtype=torch.float64)
    got = quant.e4m3_round(x.float()).float().tolist()
    for value, g in zip(x.float().tolist(), got):
        assert g == _nearest_even(value, table, 448.0), value


def test_e4m3_special_inputs():
    x = torch.tensor([math.inf, -math.inf, math.nan, -0.0, 0.0, -1e30])
    got = quant.e4m3_round(x).float()
    assert got[:2].tolist() == [448.0, -448.0] and math.isnan(got[2])
    assert torch.signbit(got[3]) and not torch.signbit(got[4]) and got[5] == -448.0
    assert quant.e4m3_codes(torch.tensor([448.0, -448.0, 2.0 ** -9])).tolist() == [0x7E, 0xFE, 0x01]


def test_e2m1_decodes_every_code():
    assert quant.e2m1_decode(torch.arange(16, dtype=torch.uint8)).tolist() == _e2m1_table()
    assert tuple(v for v in _e2m1_table()[:8]) == quant.E2M1_VALUES


def test_e2m1_rounds_to_nearest_even_everywhere():
    table = _e2m1_table()
    finite = sorted(set(quant.E2M1_VALUES))
    probes = []
    for lo, hi in zip(finite, finite[1:]):
        mid = (lo + hi) / 2
        probes += [lo, mid, math.nextafter(mid, 0), math.nextafter(mid, math.inf)]
    probes += [6.0, 6.5, 100.0, math.inf]
    x = torch.tensor(probes + [-p for p in probes])
    got = quant.e2m1_decode(quant.e2m1_codes(x)).tolist()
    for value, g in zip(x.tolist(), got):
        assert g == _nearest_even(value, table, 6.0), value
    assert quant.e2m1_codes(torch.tensor([-0.0, 0.0, math.nan])).tolist() == [8, 0, 0]


def test_nibble_order_and_round_trip():
    codes = torch.arange(16, dtype=torch.uint8).repeat(3, 1)
    packed = quant.pack_nibbles(codes)
    assert packed.shape == (3, 8) and packed[0, 0] == 0x10 and packed[0, 7] == 0xFE  # element 2i: low nibble
    assert torch.equal(quant.unpack_nibbles(packed), codes)
    with pytest.raises(ValueError, match=r"^codes: expected an even last dim"):
        quant.pack_nibbles(codes[:, :3])


def test_fp8_rows():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 64, generator=gen)
    x[0, 0] = 0.0
    codes, scale = quant.quantize_fp8_rows(x)
    assert codes.dtype == torch.float8_e4m3fn and scale.shape == (4, 3)
    assert scale[0, 0] == 1.0 and (codes[0, 0].float() == 0).all()
    inv448 = float(torch.tensor(1.0) / torch.tensor(448.0))  # fp32's 1/448
    assert torch.equal(scale[1:], (x[1:].abs().amax(-1).double() * inv448).float())  # one rounding
    rcp = (1 / scale.double()).float()  # the correctly rounded reciprocal, then one rounding of the product
    assert torch.equal(codes.float(), quant.e4m3_round((x.double() * rcp.double()[..., None]).float()).float())
    assert (codes.float().abs().amax(-1)[1:] == 448).all()  # each row's amax lands on E4M3's largest value
    y = quant.dequantize_fp8_rows(codes, scale)
    # every element within half an E4M3 step of its row scale: relative 2^-4 of the element, or the subnormal step
    assert ((y - x).abs() <= torch.maximum(x.abs() * 2.0 ** -4, scale[..., None] * 2.0 ** -10)).all()
    exact = quant.dequantize_fp8_rows(quant.e4m3_round(torch.randn(2, 32, generator=gen) * 50), torch.tensor([1.0, 1.0]))
    exact[:, 0] = 448.0  # rows whose amax is the E4M3 max: scale 1, representable values round-trip exactly
    assert torch.equal(quant.dequantize_fp8_rows(*quant.quantize_fp8_rows(exact)), exact)


def test_nvfp4_blocks():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 4, 64, generator=gen)
    g = quant.nvfp4_global_scale(x, (-2, -1))
    assert g.shape == (2, 3, 1, 1)
    ratio = x.abs().amax((-2, -1), keepdim=True) / g  # a power of two placing the amax in (1344, 2688]
    assert (torch.frexp(g)[0] == 0.5).all() and ((ratio > 1344) & (ratio <= 2688)).all()
    packed, bscale = quant.quantize_nvfp4(x, g)
    assert packed.shape == (2, 3, 4, 32) and packed.dtype == torch.uint8
    assert bscale.shape == (2, 3, 4, 4) and bscale.dtype == torch.float8_e4m3fn
    blocks = x.unflatten(-1, (4, 16))
    sixth = float(torch.tensor(1.0) / torch.tensor(6.0))  # fp32's 1/6
    want = (blocks.abs().amax(-1).double() * sixth / g.double()).float()  # one rounding of the exact product
    assert torch.equal(bscale.float(), quant.e4m3_round(want).float())
    # the codes: nearest E2M1 value of the exact quotient, ties to the even code (float64 reference)
    q = (blocks.double() / (bscale.double()[..., None] * g.double()[..., None])).flatten(-2)
    table = torch.tensor(quant.E2M1_VALUES, dtype=torch.float64)
    dist = (q.abs()[..., None] - table).abs()
    nearest = (dist == dist.amin(-1, keepdim=True)) * (2 - torch.arange(8) % 2)  # at a tie the even code
    want_codes = nearest.argmax(-1).to(torch.uint8) + 8 * torch.signbit(q).to(torch.uint8)
    assert torch.equal(quant.unpack_nibbles(packed), want_codes)
    # exact ties between neighbours go to the even code (block scale 1: the block's amax is 6)
    ties = torch.tensor([[6.0, 0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, -0.25, -5.0, 0, 0, 0, 0, 0, 0]])
    p, s = quant.quantize_nvfp4(ties, torch.ones(1, 1))
    assert s.float().item() == 1.0
    assert quant.unpack_nibbles(p)[0, :10].tolist() == [7, 0, 2, 2, 4, 4, 6, 6, 8, 14]
    y = quant.dequantize_nvfp4(packed, bscale, g)
    step = (bscale.float() * g)[..., None].expand(-1, -1, -1, -1, 16).flatten(-2)  # one E2M1 unit of the block
    assert ((y - x).abs() <= step * 1.0 + 1e-12).all()  # E2M1 steps are at most 2 units apart (4 -> 6)
    rel = float((y - x).norm() / x.norm())
    assert 0.05 < rel < 0.15  # Gaussian data: about 9%
    # representable blocks (E2M1 grid x an E4M3 block scale, global scale 1) round-trip exactly
    grid = quant.e2m1_decode(torch.randint(0, 16, (5, 64), generator=gen, dtype=torch.uint8))
    grid[:, ::16] = 6.0  # every block's amax is 6: block scale 1
    p, s = quant.quantize_nvfp4(grid, torch.ones(5, 1))
    assert (s.float() == 1.0).all() and torch.equal(quant.dequantize_nvfp4(p, s, torch.ones(5, 1)), grid)
    with pytest.raises(ValueError, match=r"^x: expected a last dim that is a multiple of 16"):
        quant.quantize_nvfp4(torch.zeros(2, 24), torch.ones(2, 1))


def test_non_finite_rows_and_blocks_decode_to_nan():
    x = torch.randn(3, 32)
    x[0, 5] = math.nan
    x[1, 20] = math.inf
    codes, scale = quant.quantize_fp8_rows(x)
    y = quant.dequantize_fp8_rows(codes, scale)
    assert y[:2].isnan().all() and torch.isfinite(y[2]).all()
    g = quant.nvfp4_global_scale(x, (-1,))
    assert torch.isfinite(g).all()
    y = quant.dequantize_nvfp4(*quant.quantize_nvfp4(x, g), g)
    assert y[0, :16].isnan().all() and torch.isfinite(y[0, 16:]).all()
    assert y[1, 16:].isnan().all() and torch.isfinite(y[1, :16]).all()
    assert torch.isfinite(y[2]).all()
    zeros = torch.zeros(2, 32)
    assert torch.equal(quant.dequantize_nvfp4(*quant.quantize_nvfp4(zeros, quant.nvfp4_global_scale(zeros, (-1,))),
                                              torch.ones(2, 1)), zeros)


def test_pow2_scale_is_the_least_power_of_two_that_fits():
    for top in (448.0, 2688.0):
        k = torch.arange(-90, 100, dtype=torch.float32)
        exact = top * torch.exp2(k)  # amax = top · 2^k fits 2^k exactly; the next float up needs 2^(k + 1)
        assert torch.equal(quant.pow2_scale(exact, top), torch.exp2(k))
        above = torch.nextafter(exact, torch.tensor(math.inf))
        assert torch.equal(quant.pow2_scale(above, top), torch.exp2(k + 1))
        amax = torch.rand(10000, generator=torch.Generator().manual_seed(2)) * 1e6 + 1e-30
        s = quant.pow2_scale(amax, top)
        assert ((amax <= top * s) & (amax > top * s / 2)).all()
    edge = torch.tensor([0.0, 2.0**-101, math.inf, math.nan, 2.0**-100])
    assert quant.pow2_scale(edge, 448.0).tolist() == [1.0, 1.0, 1.0, 1.0, 2.0**-108]
