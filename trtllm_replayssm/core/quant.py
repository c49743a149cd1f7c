"""Exact torch codecs of the quantized state formats (CPU and CUDA alike): FP8 E4M3 with one fp32 scale per state
row, and NVFP4 (E2M1 codes two per byte, one E4M3 scale per 16 elements along the contiguous state axis, times an
fp32 second-level scale). Rounding is to nearest, ties to even; finite values beyond a format's range saturate.

The kernels' quantized paths and the float64 references that test them apply these functions at the same points.
A row (FP8) or block (NVFP4) holding a NaN or an Inf decodes to NaN in every element: a non-finite state stays
visible (docs/design.md, NaN and Inf).

Stochastic rounding (SR), the contract the kernels reproduce bit for bit. Uniforms: a checkpoint write of the state
of ``slot`` after ``flushes`` flushes, in a layer with ``seed``, on ``stream`` (0: the master / plain checkpoint, 1:
the read copy), gives element ``e`` (its C-order index in the slot's checkpoint) the uniform ``u = (w >> 8) · 2^-24``
where ``w`` is word ``e & 3`` of ``philox4x32_10(counter = (q & 0xFFFFFFFF, q >> 32, stream, seed), key = (slot,
flushes))`` with ``q = e >> 2``: one Philox call per four elements; every word is a uint32 (slot and flushes taken mod
2^32). Rounding: for finite ``|x|`` up to the format's largest finite value, ``lo`` is the largest representable
magnitude ``<= |x|``, ``hi`` the next one above, ``p = (|x| - lo) / (hi - lo)`` (exact in fp32: the step is a power of
two), and the result is ``±hi`` if ``u < p`` else ``±lo`` with the sign of ``x`` (-0 stays -0; representable values
never change). ``P(hi) = ceil(p · 2^24) · 2^-24``, exactly ``p`` wherever ``|x| >= (hi - lo) / 2``. Beyond the finite
range fp16 / bf16 round to nearest (possibly to Inf), E4M3 and E2M1 saturate (±448, ±6) and NaN follows the
round-to-nearest codecs. Scales (FP8 row scales, NVFP4 block scales) always round to nearest.
"""
from __future__ import annotations

import math

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
SCALE_FLOOR = 2.0**-100  # rows (FP8) and second-level groups (NVFP4) whose amax is below this get scale 1
NVFP4_BLOCK = 16  # elements per E4M3 block scale
# The eight magnitudes of E2M1 (code & 7): exponent 2 bits (bias 1), mantissa 1 bit, subnormal 0.5.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
# Stochastic-rounding target formats and the dtype round_stochastic returns for each (E2M1: uint8 codes).
SR_FORMATS = {"fp16": torch.float16, "bf16": torch.bfloat16, "e4m3": torch.float8_e4m3fn, "e2m1": torch.uint8}
_M32 = 0xFFFFFFFF
_PHILOX_M = (0xD2511F53, 0xCD9E8D57)  # Random123 philox4x32 multipliers
_PHILOX_W = (0x9E3779B9, 0xBB67AE85)  # and Weyl key increments


# ---------------------------------------------------------------------------------------------------- E4M3
def e4m3_round(x: torch.Tensor) -> torch.Tensor:
    """``x`` as ``torch.float8_e4m3fn``: round to nearest even, finite values and ±Inf saturate to ±448, NaN stays
    NaN (the behaviour of CUDA's ``__NV_SATFINITE`` conversion)."""
    x = x.float()
    return torch.where(x.isnan(), x, x.clamp(-E4M3_MAX, E4M3_MAX)).to(torch.float8_e4m3fn)


def e4m3_codes(x: torch.Tensor) -> torch.Tensor:
    """The uint8 codes of :func:`e4m3_round`."""
    return e4m3_round(x).view(torch.uint8)


def e4m3_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of uint8 E4M3 codes (0x7F / 0xFF are NaN)."""
    return codes.view(torch.float8_e4m3fn).float()


# ---------------------------------------------------------------------------------------------------- E2M1
def e2m1_codes(x: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes (0..15, bit 3 the sign) of ``x``: nearest of ±{0, 0.5, 1, 1.5, 2, 3, 4, 6}, ties to the
    even code, magnitudes beyond 6 saturate; NaN gives code 0 (callers mark NaN blocks through their scale)."""
    x = x.float()
    mag = x.abs().nan_to_num(nan=0.0).clamp(max=E2M1_MAX)
    # Thresholds between neighbours; at a tie the even code (the lower one here for odd->even steps) wins.
    bounds = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0], device=x.device)
    code = torch.bucketize(mag, bounds, right=False)  # mag <= bounds[i] -> code i, the lower neighbour at a tie
    tie = (code < len(bounds)) & (bounds[code.clamp(max=len(bounds) - 1)] == mag)
    code = code + (tie & (code % 2 == 1)).to(code.dtype)  # an odd lower neighbour: the even upper one wins
    sign = (x < 0) | ((x == 0) & torch.signbit(x))
    return (code + 8 * sign.to(code.dtype)).to(torch.uint8)


def e2m1_decode(codes: torch.Tensor) -> torch.Tensor:
    """float32 values of uint8 E2M1 codes (the low 4 bits)."""
    c = codes.long() & 15
    e, m = (c >> 1) & 3, (c & 1).float()
    # no table tensor: nothing is copied from the host, so decoding can be captured in a CUDA graph
    mag = torch.where(e == 0, 0.5 * m, torch.ldexp(1.0 + 0.5 * m, e - 1))
    return torch.where(c >= 8, -mag, mag)


def pack_nibbles(codes: torch.Tensor) -> torch.Tensor:
    """Two 4-bit codes per byte along the last axis: element 2i in the low nibble, 2i+1 in the high one."""
    if codes.shape[-1] % 2:
        raise ValueError(f"codes: expected an even last dim, got shape {tuple(codes.shape)}")
    c = codes.to(torch.uint8) & 15
    return c[..., 0::2] | (c[..., 1::2] << 4)


def unpack_nibbles(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of :func:`pack_nibbles`."""
    return torch.stack((packed & 15, packed >> 4), dim=-1).flatten(-2)


# ---------------------------------------------------------------------------------------------------- FP8 rows
def pow2_scale(amax: torch.Tensor, top: float) -> torch.Tensor:
    """The least power of two ``s`` with ``amax <= top · s``, elementwise (fp32); 1 where ``amax`` is below
    :data:`SCALE_FLOOR` (zero rows) or not finite. Dividing by it is exact, so encoders need no division."""
    amax = amax.float()
    m, e = torch.frexp(amax)
    m_top, e_top = math.frexp(top)
    s = torch.ldexp(torch.ones_like(amax), e - e_top + (m > m_top).to(e.dtype))
    return torch.where((amax >= SCALE_FLOOR) & torch.isfinite(amax), s, torch.ones_like(amax))


def quantize_fp8_rows(x: torch.Tensor, u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 state: codes ``float8_e4m3fn`` of ``x`` and one fp32 scale per row (the last axis): ``scale = amax ·
    (1/448)`` (fp32's 1/448, one rounding; 1 for a row whose amax is below :data:`SCALE_FLOOR`), ``x ≈ codes *
    scale``; the codes round ``x · (1 / scale)`` (the fp32 reciprocal, correctly rounded: one division per row, the
    kernels' arithmetic). A row with a NaN or Inf gets a NaN scale. With uniforms ``u`` (shaped like ``x``) the codes
    round stochastically (:func:`round_stochastic`), the scale does not."""
    x = x.float()
    amax = x.abs().amax(dim=-1)
    bad = ~torch.isfinite(x).all(dim=-1)
    scale = torch.where(amax >= SCALE_FLOOR, amax * torch.tensor(1 / E4M3_MAX, dtype=torch.float32),
                        torch.ones_like(amax))
    scale = torch.where(bad, torch.full_like(scale, float("nan")), scale)
    z = torch.where(bad[..., None], torch.zeros_like(x), x * torch.reciprocal(scale)[..., None])
    return (e4m3_round(z) if u is None else round_stochastic(z, "e4m3", u)), scale


def dequantize_fp8_rows(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``codes * scale`` (scale per row)."""
    return codes.float() * scale[..., None]


# ---------------------------------------------------------------------------------------------------- NVFP4
def nvfp4_global_scale(x: torch.Tensor, reduce_dims: tuple[int, ...]) -> torch.Tensor:
    """The fp32 second-level scale over ``reduce_dims`` (kept as size-1 dims): the power of two
    :func:`pow2_scale` of the finite amax against ``6 · 448``, so that every block scale fits E4M3."""
    amax = x.float().abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).amax(dim=reduce_dims, keepdim=True)
    return pow2_scale(amax, E2M1_MAX * E4M3_MAX)


def e2m1_codes_of_quotient(x: torch.Tensor, d: torch.Tensor) -> torch.Tensor:
    """uint8 E2M1 codes of ``x / d`` (``d > 0``, broadcasting), rounded to nearest (ties to the even code) from the
    exact quotient: ``|x|`` against the midpoints between E2M1 neighbours times ``d`` (exact fp32 products while
    ``d`` has at most 20 significant bits); magnitudes beyond 6 saturate, NaN gives 0, the sign is ``x``'s."""
    x = x.float()
    mag = x.abs()
    code = torch.zeros_like(x, dtype=torch.uint8)
    for t, tie_up in ((0.25, False), (0.75, True), (1.25, False), (1.75, True), (2.5, False), (3.5, True),
                      (5.0, False)):
        bound = t * d
        code += ((mag >= bound) if tie_up else (mag > bound)).to(torch.uint8)
    return code + 8 * torch.signbit(x).to(torch.uint8)


def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor,
                   u: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 of ``x`` [..., C] (C a multiple of 16): packed E2M1 codes uint8 [..., C/2] and E4M3 block scales
    [..., C/16] (float8_e4m3fn) such that ``x ≈ e2m1 · block_scale · global_scale``. ``global_scale`` broadcasts
    against ``x`` and is a power of two (:func:`nvfp4_global_scale`). The block scale is ``amax_block · (1/6) /
    global_scale`` (one fp32 rounding: ``1/6`` is fp32's, the rest exact) rounded to E4M3; the codes round
    ``x / (block_scale · global_scale)`` to nearest from the exact quotient (:func:`e2m1_codes_of_quotient`), or
    with uniforms ``u`` (shaped like ``x``) stochastically from ``x · RN(1 / block_scale) / global_scale``. A block
    with a NaN or an Inf gets a NaN block scale and zero codes, as does a block whose scale rounds to 0."""
    if x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"x: expected a last dim that is a multiple of {NVFP4_BLOCK}, got shape {tuple(x.shape)}")
    blocks = x.float().unflatten(-1, (-1, NVFP4_BLOCK))                                   # [..., C/16, 16]
    g = global_scale.float()[..., None]                                                  # broadcasts to the blocks
    bad = ~torch.isfinite(blocks).all(dim=-1)                                            # [..., C/16]
    amax = blocks.abs().amax(dim=-1)
    sixth_over_g = torch.reciprocal(g[..., 0]) * torch.tensor(1 / 6, dtype=torch.float32)  # exact: g a power of two
    bscale = e4m3_round(torch.where(bad, torch.full_like(amax, float("nan")), amax * sixth_over_g))
    b = bscale.float()[..., None]
    live = (b > 0) & ~bad[..., None]
    if u is None:
        codes = torch.where(live, e2m1_codes_of_quotient(blocks, torch.where(live, b * g, 1.0)), 0)
    else:
        inv = torch.reciprocal(torch.where(live, b, 1.0)) * torch.reciprocal(g)
        z = torch.where(live, blocks * inv, 0.0)
        codes = round_stochastic(z, "e2m1", u.float().unflatten(-1, (-1, NVFP4_BLOCK)))
    return pack_nibbles(codes.flatten(-2)), bscale


def dequantize_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """float32 values of :func:`quantize_nvfp4`'s output."""
    values = e2m1_decode(unpack_nibbles(packed)).unflatten(-1, (-1, NVFP4_BLOCK))
    return (values * block_scale.float()[..., None] * global_scale.float()[..., None]).flatten(-2)


# ---------------------------------------------------------------------------------------------------- SR
def _mulhilo(m: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) words of the 64-bit product of the uint32 constant ``m`` and uint32 values ``b`` (int64): ``b`` split
    into 16-bit limbs keeps every partial product below 2^49."""
    t0, t1 = m * (b & 0xFFFF), m * (b >> 16)
    mid = t0 + ((t1 & 0xFFFF) << 16)
    return (t1 >> 16) + (mid >> 32), mid & _M32


def philox4x32_10(counter: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """Random123's Philox4x32-10 of uint32 values held in int64: ``counter`` [..., 4] and ``key`` [..., 2]
    (broadcasting) give int64 [..., 4] in [0, 2^32)."""
    shape = torch.broadcast_shapes(counter.shape[:-1], key.shape[:-1])
    c0, c1, c2, c3 = counter.expand(*shape, 4).unbind(-1)
    k0, k1 = key.expand(*shape, 2).unbind(-1)
    for r in range(10):
        if r:
            k0, k1 = (k0 + _PHILOX_W[0]) & _M32, (k1 + _PHILOX_W[1]) & _M32
        (hi0, lo0), (hi1, lo1) = _mulhilo(_PHILOX_M[0], c0), _mulhilo(_PHILOX_M[1], c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return torch.stack((c0, c1, c2, c3), dim=-1)


def _sr_words(q: torch.Tensor, slot: torch.Tensor, flushes: torch.Tensor, seed: int, stream: int) -> torch.Tensor:
    """The four Philox words [n, ..., 4] of counter indices ``q`` [n or 1, ...] (int64) for rows keyed by ``slot``,
    ``flushes`` [n]."""
    key = torch.stack((slot, flushes), dim=-1).to(q.device).long() & _M32
    counter = (q & _M32, q >> 32, torch.full_like(q, stream & _M32), torch.full_like(q, seed & _M32))
    return philox4x32_10(torch.stack(counter, dim=-1), key.reshape(-1, *(1,) * (q.dim() - 1), 2))


def _words_to_uniforms(w: torch.Tensor) -> torch.Tensor:
    return (w >> 8).float() * 2.0 ** -24


def sr_uniforms_at(index: torch.Tensor, slot: torch.Tensor, flushes: torch.Tensor, seed: int,
                   stream: int) -> torch.Tensor:
    """float32 SR uniforms of elements ``index`` [n, ...] (int64, C-order indices into row i's checkpoint) of rows
    keyed by ``slot``, ``flushes`` [n] (int64); one Philox call per element (see :func:`sr_uniforms`)."""
    w = _sr_words(index >> 2, slot, flushes, seed, stream)
    return _words_to_uniforms(w.gather(-1, (index & 3).expand(w.shape[:-1]).unsqueeze(-1)).squeeze(-1))


def sr_uniforms(shape: tuple[int, ...] | torch.Size, slot: torch.Tensor, flushes: torch.Tensor, seed: int, stream: int,
                device: torch.device | str | None = None) -> torch.Tensor:
    """float32 SR uniforms in [0, 1) of ``shape`` [n, ...]: row i is the checkpoint of slot ``slot[i]`` after
    ``flushes[i]`` flushes (int64 [n] each), element e its C-order index; the module docstring has the layout.
    ``device`` defaults to ``slot``'s."""
    numel = math.prod(shape[1:])
    q = torch.arange((numel + 3) // 4, device=slot.device if device is None else device)[None]
    return _words_to_uniforms(_sr_words(q, slot, flushes, seed, stream).flatten(-2)[:, :numel]).reshape(shape)


def round_stochastic(x: torch.Tensor, fmt: str, u: torch.Tensor) -> torch.Tensor:
    """``x`` rounded stochastically with uniforms ``u`` (same shape) to ``fmt`` (a key of ``SR_FORMATS``), by the rule
    of the module docstring: fp16 / bf16 give that dtype, e4m3 ``float8_e4m3fn``, e2m1 uint8 codes as
    :func:`e2m1_codes`."""
    if fmt not in SR_FORMATS:
        raise ValueError(f"fmt: expected one of {sorted(SR_FORMATS)}, got {fmt!r}")
    if u.shape != x.shape:
        raise ValueError(f"u: expected the shape of x {tuple(x.shape)}, got {tuple(u.shape)}")
    x, u, dtype = x.float(), u.float(), SR_FORMATS[fmt]
    top = E2M1_MAX if fmt == "e2m1" else torch.finfo(dtype).max
    inside = x.abs() <= top                                                              # False for NaN
    a = torch.where(inside, x.abs(), 0.0)
    if fmt == "e2m1":
        table = torch.tensor(E2M1_VALUES, device=x.device)
        code, value = e2m1_codes(a).long(), lambda c: table[c.clamp(max=7)]
    else:
        itype = torch.int16 if dtype.itemsize == 2 else torch.int8
        code, value = a.to(dtype).view(itype).long(), lambda c: c.to(itype).view(dtype).float()
    lo_code = code - (value(code) > a).long()        # the nearest code, one down where that one lies above |x|
    lo, hi = value(lo_code), value(lo_code + 1)      # hi is unused (p = 0) where |x| = lo, e.g. the largest value
    p = torch.where(a > lo, (a - lo) / (hi - lo), 0.0)
    y = torch.where(inside, torch.where(u < p, hi, lo).copysign(x), x)
    return e2m1_codes(y) if fmt == "e2m1" else e4m3_round(y) if fmt == "e4m3" else y.to(dtype)


def to_dtype_rounded(x: torch.Tensor, dtype: torch.dtype, u: torch.Tensor | None = None) -> torch.Tensor:
    """``x`` as ``dtype`` (float32, float16 or bfloat16): round to nearest, or stochastically with uniforms ``u``."""
    if u is None or dtype == torch.float32:
        return x.to(dtype)
    return round_stochastic(x, {torch.float16: "fp16", torch.bfloat16: "bf16"}[dtype], u)
