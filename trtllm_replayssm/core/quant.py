"""Exact torch codecs of the quantized state formats (CPU and CUDA alike): FP8 E4M3 with one fp32 scale per state
row, and NVFP4 (E2M1 codes two per byte, one E4M3 scale per 16 elements along the contiguous state axis, times an
fp32 second-level scale). Rounding is to nearest, ties to even; finite values beyond a format's range saturate.

The kernels' quantized paths and the float64 references that test them apply these functions at the same points.
A row (FP8) or block (NVFP4) holding a NaN or an Inf decodes to NaN in every element: a non-finite state stays
visible (docs/design.md, NaN and Inf).
"""
from __future__ import annotations

import torch

E4M3_MAX = 448.0
E2M1_MAX = 6.0
NVFP4_BLOCK = 16  # elements per E4M3 block scale
# The eight magnitudes of E2M1 (code & 7): exponent 2 bits (bias 1), mantissa 1 bit, subnormal 0.5.
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)


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
    table = torch.tensor(E2M1_VALUES, device=codes.device)
    c = codes.long() & 15
    mag = table[c & 7]
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
def quantize_fp8_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FP8 state: codes ``float8_e4m3fn`` of ``x`` and one fp32 scale per row (the last axis): ``scale =
    amax / 448`` (1 for an all-zero row), ``x ≈ codes * scale``. A row with a NaN or Inf gets a NaN scale."""
    x = x.float()
    amax = x.abs().amax(dim=-1)
    bad = ~torch.isfinite(x).all(dim=-1)
    scale = torch.where(amax > 0, amax / E4M3_MAX, torch.ones_like(amax))
    scale = torch.where(bad, torch.full_like(scale, float("nan")), scale)
    codes = e4m3_round(torch.where(bad[..., None], torch.zeros_like(x), x / scale[..., None]))
    return codes, scale


def dequantize_fp8_rows(codes: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 ``codes * scale`` (scale per row)."""
    return codes.float() * scale[..., None]


# ---------------------------------------------------------------------------------------------------- NVFP4
def nvfp4_global_scale(x: torch.Tensor, reduce_dims: tuple[int, ...]) -> torch.Tensor:
    """The fp32 second-level scale ``amax / (6 · 448)`` over ``reduce_dims`` (kept as size-1 dims), so that every
    block scale fits E4M3; 1 where the amax is 0."""
    amax = x.float().abs().nan_to_num(nan=0.0, posinf=0.0, neginf=0.0).amax(dim=reduce_dims, keepdim=True)
    return torch.where(amax > 0, amax / (E2M1_MAX * E4M3_MAX), torch.ones_like(amax))


def quantize_nvfp4(x: torch.Tensor, global_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """NVFP4 of ``x`` [..., C] (C a multiple of 16): packed E2M1 codes uint8 [..., C/2] and E4M3 block scales
    [..., C/16] (float8_e4m3fn) such that ``x ≈ e2m1 · block_scale · global_scale``. ``global_scale`` broadcasts
    against ``x`` (see :func:`nvfp4_global_scale`). The block scale is ``amax_block / (6 · global_scale)`` rounded to
    E4M3; elements are divided by the rounded scale before their own rounding. A block with a NaN or an Inf gets a
    NaN block scale."""
    if x.shape[-1] % NVFP4_BLOCK:
        raise ValueError(f"x: expected a last dim that is a multiple of {NVFP4_BLOCK}, got shape {tuple(x.shape)}")
    blocks = x.float().unflatten(-1, (-1, NVFP4_BLOCK))                                   # [..., C/16, 16]
    g = global_scale.float()[..., None]                                                  # broadcasts to the blocks
    bad = ~torch.isfinite(blocks).all(dim=-1)                                            # [..., C/16]
    amax = blocks.abs().amax(dim=-1)
    bscale = e4m3_round(torch.where(bad, torch.full_like(amax, float("nan")), amax / (E2M1_MAX * g[..., 0])))
    denom = bscale.float()[..., None] * g
    live = (denom > 0) & ~bad[..., None]
    codes = e2m1_codes(torch.where(live, blocks / torch.where(live, denom, 1.0), 0.0)).flatten(-2)
    return pack_nibbles(codes), bscale


def dequantize_nvfp4(packed: torch.Tensor, block_scale: torch.Tensor, global_scale: torch.Tensor) -> torch.Tensor:
    """float32 values of :func:`quantize_nvfp4`'s output."""
    values = e2m1_decode(unpack_nibbles(packed)).unflatten(-1, (-1, NVFP4_BLOCK))
    return (values * block_scale.float()[..., None] * global_scale.float()[..., None]).flatten(-2)
