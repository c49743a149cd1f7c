"""Fused decoder-layer ops (RMSNorm + residual, gated RMSNorm, conv1d update, MLP activations) against float64 math
written out here: the CUDA kernels on a GPU, the PyTorch reference (their CPU path) without one."""
from __future__ import annotations

import pytest
import torch

from trtllm_replayssm.ops import layers as ops

pytestmark = pytest.mark.kernels
DEV = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.bfloat16, torch.float32]


def _tol(dtype: torch.dtype) -> dict[str, float]:
    # bf16: outputs are rounded to bf16 (and the reference rounds intermediates too): 2 ulps
    return dict(rtol=2 ** -6, atol=2 ** -6) if dtype == torch.bfloat16 else dict(rtol=1e-5, atol=1e-5)


def _rnd(gen: torch.Generator, *shape: int, dtype: torch.dtype) -> torch.Tensor:
    return torch.randn(shape, generator=gen).to(dtype).to(DEV)


def _rms64(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = h.double()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.double()


def _silu64(v: torch.Tensor) -> torch.Tensor:
    v = v.double()
    return v * torch.sigmoid(v)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("unit_offset", [False, True])
def test_rms_norm_rows_and_strided_heads(dtype, unit_offset):
    gen = torch.Generator().manual_seed(1)
    x = _rnd(gen, 7, 3136, dtype=dtype)
    w = _rnd(gen, 3136, dtype=dtype)
    scale = w.double() + 1 if unit_offset else w.double()
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5, unit_offset).double(), _rms64(x, scale, 1e-5),
                               **_tol(dtype))
    # q of a packed [q | gate] projection: [b, heads, hd] rows with a head stride of 2 * hd
    packed = _rnd(gen, 5, 4, 2 * 128, dtype=dtype)
    q = packed.chunk(2, dim=-1)[0]
    wq = _rnd(gen, 128, dtype=dtype)
    sq = wq.double() + 1 if unit_offset else wq.double()
    torch.testing.assert_close(ops.rms_norm(q, wq, 1e-6, unit_offset).double(), _rms64(q, sq, 1e-6), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_add_rms_norm_updates_the_residual(dtype):
    gen = torch.Generator().manual_seed(2)
    big = _rnd(gen, 6, 2 * 2560, dtype=dtype)
    x = big[:, :2560]  # a row-strided input
    res = _rnd(gen, 6, 2560, dtype=dtype)
    w = _rnd(gen, 2560, dtype=dtype)
    want_res = (res.double() + x.double()).to(dtype)
    out = ops.rms_norm(x, w, 1e-5, residual=res)
    torch.testing.assert_close(res, want_res, rtol=0, atol=0)
    torch.testing.assert_close(out.double(), _rms64(want_res, w, 1e-5), **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_rms_norm_both_orders(dtype):
    gen = torch.Generator().manual_seed(3)
    # Mamba-2: groups of 96 over 8 * 96 channels, z a slice of a wider projection
    y = _rnd(gen, 6, 8 * 96, dtype=dtype)
    z = _rnd(gen, 6, 8 * 96 + 50, dtype=dtype)[:, :8 * 96]
    w = _rnd(gen, 8 * 96, dtype=dtype)
    g = (y.double() * _silu64(z)).unflatten(-1, (8, 96))
    want = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)).flatten(-2) * w.double()
    torch.testing.assert_close(ops.gated_rms_norm(y, z, w, 96, 1e-5, False).double(), want, **_tol(dtype))
    # Qwen3.5 GDN: per value head, norm first, then the gate
    o = _rnd(gen, 6, 4, 128, dtype=dtype)
    zq = _rnd(gen, 6, 4 * 128, dtype=dtype).unflatten(-1, (4, 128))
    wq = _rnd(gen, 128, dtype=dtype)
    want = _rms64(o, wq, 1e-6) * _silu64(zq)
    torch.testing.assert_close(ops.gated_rms_norm(o, zq, wq, 128, 1e-6, True).double(), want, **_tol(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("width,bias,silu", [(4, True, True), (4, False, True), (3, True, False), (2, False, False)])
def test_conv1d_update_steps_a_sliding_window(dtype, width, bias, silu):
    gen = torch.Generator().manual_seed(4)
    batch, channels = 5, 300  # not a multiple of the CTA width
    weight = _rnd(gen, channels, 1, width, dtype=dtype)
    b = _rnd(gen, channels, dtype=dtype) if bias else None
    state = _rnd(gen, batch, channels, width - 1, dtype=dtype)
    window = state.double()
    for _ in range(6):
        x = _rnd(gen, batch, channels + 7, dtype=dtype)[:, 3:3 + channels]  # row-strided, offset input
        window = torch.cat([window, x.double().unsqueeze(-1)], -1)
        y = (window * weight[:, 0].double()).sum(-1) + (b.double() if bias else 0)
        want = _silu64(y) if silu else y
        got = ops.conv1d_update(x, state, weight, b, silu)
        torch.testing.assert_close(got.double(), want, **_tol(dtype))
        window = window[:, :, 1:]
        torch.testing.assert_close(state.double(), window, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_mlp_activations(dtype):
    gen = torch.Generator().manual_seed(5)
    a, b = _rnd(gen, 3, 1000, dtype=dtype), _rnd(gen, 3, 1000, dtype=dtype)
    torch.testing.assert_close(ops.mlp_act(a, None, "relu2").double(), a.double().clamp(min=0) ** 2, **_tol(dtype))
    torch.testing.assert_close(ops.mlp_act(a, b, "swiglu").double(), _silu64(a) * b.double(), **_tol(dtype))


def test_bad_inputs_name_the_argument():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(x, torch.ones(32), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        ops.rms_norm(x, torch.ones(64), 1e-5, residual=torch.zeros(4, 32))
    with pytest.raises(ValueError, match="group_size"):
        ops.gated_rms_norm(x, x, torch.ones(64), 48, 1e-5, False)
    with pytest.raises(ValueError, match="weight"):
        ops.conv1d_update(x, torch.zeros(4, 64, 9), torch.ones(64, 1, 10))
    with pytest.raises(ValueError, match="conv_state"):
        ops.conv1d_update(x, torch.zeros(4, 64, 2), torch.ones(64, 1, 4))
    with pytest.raises(ValueError, match="b:"):
        ops.mlp_act(x, None, "swiglu")
    with pytest.raises(ValueError, match="kind"):
        ops.mlp_act(x, None, "gelu")
