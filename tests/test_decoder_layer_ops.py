"""Fused decoder-layer ops (RMSNorm + residual, gated RMSNorm, conv1d speculative window, MLP activations,
RoPE, attention) against float64 math written out here: the CUDA kernels on a GPU (vector and element paths: aligned
and odd sizes / strides), the PyTorch reference (their CPU path) without one."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import ACT_DTYPES, DEV, act_tol, randn_on, silu64
from trtllm_replayssm.lab.layers import ops as ops

pytestmark = pytest.mark.kernels


def _rms64(h: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    h = h.double()
    return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("unit_offset", [False, True])
@pytest.mark.parametrize("dim", [3136, 100, 9000])  # vectors in registers / odd size / too long for registers
def test_rms_norm_rows_and_strided_heads(dtype, unit_offset, dim):
    gen = torch.Generator().manual_seed(1)
    x = randn_on(gen, 7, dim, dtype=dtype)
    w = randn_on(gen, dim, dtype=dtype)
    scale = w.double() + 1 if unit_offset else w.double()
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5, unit_offset).double(), _rms64(x, scale, 1e-5),
                               **act_tol(dtype))
    # q of a packed [q | gate] projection: [b, heads, hd] rows with a head stride of 2 * hd
    packed = randn_on(gen, 5, 4, 2 * 128, dtype=dtype)
    q = packed.chunk(2, dim=-1)[0]
    wq = randn_on(gen, 128, dtype=dtype)
    sq = wq.double() + 1 if unit_offset else wq.double()
    torch.testing.assert_close(ops.rms_norm(q, wq, 1e-6, unit_offset).double(), _rms64(q, sq, 1e-6), **act_tol(dtype))


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("dim,offset", [(2560, 0), (2560, 1), (36, 0)])
def test_add_rms_norm_updates_the_residual(dtype, dim, offset):
    gen = torch.Generator().manual_seed(2)
    big = randn_on(gen, 6, 2 * dim + 1, dtype=dtype)
    x = big[:, offset:offset + dim]  # a row-strided input (misaligned with an offset)
    res = randn_on(gen, 6, dim, dtype=dtype)
    w = randn_on(gen, dim, dtype=dtype)
    want_res = (res.double() + x.double()).to(dtype)
    out = ops.rms_norm(x, w, 1e-5, residual=res)
    torch.testing.assert_close(res, want_res, rtol=0, atol=0)
    torch.testing.assert_close(out.double(), _rms64(want_res, w, 1e-5), **act_tol(dtype))


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("z_extra", [64, 50])  # z's row stride keeps / breaks 16-byte alignment
def test_gated_rms_norm_both_orders(dtype, z_extra):
    gen = torch.Generator().manual_seed(3)
    # Mamba-2: groups of 96 over 8 * 96 channels, z a slice of a wider projection
    y = randn_on(gen, 6, 8 * 96, dtype=dtype)
    z = randn_on(gen, 6, 8 * 96 + z_extra, dtype=dtype)[:, :8 * 96]
    w = randn_on(gen, 8 * 96, dtype=dtype)
    g = (y.double() * silu64(z)).unflatten(-1, (8, 96))
    want = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)).flatten(-2) * w.double()
    torch.testing.assert_close(ops.gated_rms_norm(y, z, w, 96, 1e-5, False).double(), want, **act_tol(dtype))
    # Qwen3.5 GDN: per value head (one weight shared by the heads), norm first, then the gate; z a slice of the
    # packed input projection
    o = randn_on(gen, 6, 4, 128, dtype=dtype)
    zq = randn_on(gen, 6, 4 * 128 + z_extra, dtype=dtype)[:, z_extra:]
    wq = randn_on(gen, 128, dtype=dtype)
    want = (_rms64(o, wq, 1e-6) * silu64(zq.unflatten(-1, (4, 128)))).flatten(-2)
    got = ops.gated_rms_norm(o.flatten(-2), zq, wq, 128, 1e-6, True)
    torch.testing.assert_close(got.double(), want, **act_tol(dtype))


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("group_size", [1536, 40])  # a CTA per group (too long for a warp) / a warp per group
def test_gated_rms_norm_group_sizes(dtype, group_size):
    gen = torch.Generator().manual_seed(7)
    y, z = randn_on(gen, 3, 2 * group_size, dtype=dtype), randn_on(gen, 3, 2 * group_size, dtype=dtype)
    w = randn_on(gen, 2 * group_size, dtype=dtype)
    g = (y.double() * silu64(z)).unflatten(-1, (2, group_size))
    want = (g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + 1e-5)).flatten(-2) * w.double()
    torch.testing.assert_close(ops.gated_rms_norm(y, z, w, group_size, 1e-5, False).double(), want, **act_tol(dtype))


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("width,bias,silu", [(4, True, True), (3, False, False)])
@pytest.mark.parametrize("T", [1, 4, 8])
@pytest.mark.parametrize("channels,offset", [(304, 0), (300, 3)])  # vector path (width 4) / element path
def test_conv1d_window_verifies_and_commits_the_accepted_prefix(dtype, width, bias, silu, T, channels, offset):
    """conv1d_verify of a window (row- and token-strided inputs): every token's output from the committed inputs and
    the window up to it, the state untouched; conv1d_commit_: each row's state is its last W-1 inputs after exactly
    its accepted count (all, only the first, mixed), unchanged for pad rows whose counts are out of range on CUDA."""
    gen = torch.Generator().manual_seed(T * 10 + width)
    batch = 6
    weight = randn_on(gen, channels, 1, width, dtype=dtype)
    b = randn_on(gen, channels, dtype=dtype) if bias else None
    state = randn_on(gen, batch, channels, width - 1, dtype=dtype)
    for _ in range(4):
        x = randn_on(gen, batch, T, channels + 8, dtype=dtype)[:, :, offset:offset + channels]
        inputs = torch.cat([state.double(), x.double().transpose(1, 2)], -1)  # [b, C, W-1+T]
        windows = inputs.unfold(-1, width, 1)  # [b, C, T, W]
        y = (windows * weight[:, 0].double()[None, :, None, :]).sum(-1).transpose(1, 2)
        y = y + (b.double() if bias else 0)
        before = state.clone()
        got = ops.conv1d_verify(x, state, weight, b, silu)
        torch.testing.assert_close(got.double(), silu64(y) if silu else y, **act_tol(dtype))
        assert torch.equal(state, before)
        accepted = torch.randint(1, T + 1, (batch,), generator=gen)
        accepted[0], accepted[1] = T, 1
        ops.conv1d_commit_(state, x.contiguous(), accepted.to(DEV))
        for r in range(batch):
            a = int(accepted[r])
            assert torch.equal(state[r].double(), inputs[r, :, a:a + width - 1]), f"row {r} accepted {a}"
    with pytest.raises(ValueError, match=r"^accepted: expected 1..%d per row" % T):
        ops.conv1d_commit_(state, x.contiguous(), torch.zeros(batch, dtype=torch.long, device=DEV))
    with pytest.raises(ValueError, match=r"^x: expected a window of 1 to 8 tokens"):
        ops.conv1d_verify(torch.zeros(batch, 9, channels, dtype=dtype, device=DEV), state, weight, b, silu)
    with pytest.raises(ValueError, match=r"^conv_state: expected shape"):
        ops.conv1d_verify(x, state[:, :4], weight, b, silu)


@pytest.mark.gpu
def test_conv1d_commit_leaves_rows_with_out_of_range_counts():
    """On CUDA the commit kernel writes no row whose count is outside 1 .. T (a pad row in a captured graph)."""
    gen = torch.Generator().manual_seed(9)
    state = randn_on(gen, 3, 64, 3, dtype=torch.bfloat16)
    x = randn_on(gen, 3, 4, 64, dtype=torch.bfloat16)
    before = state.clone()
    torch.ops.replayssm.conv1d_commit(state, x, torch.tensor([0, 5, 2], device="cuda"))
    assert torch.equal(state[:2], before[:2]) and torch.equal(state[2, :, :1], before[2, :, 2:])


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("width", [1000, 999])
def test_mlp_activations(dtype, width):
    gen = torch.Generator().manual_seed(5)
    a, b = randn_on(gen, 3, 2 * width, dtype=dtype).split(width, -1)  # halves of a packed gate/up projection
    torch.testing.assert_close(ops.mlp_act(a, None, "relu2").double(), a.double().clamp(min=0) ** 2, **act_tol(dtype))
    torch.testing.assert_close(ops.mlp_act(a, b, "swiglu").double(), silu64(a) * b.double(), **act_tol(dtype))


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("rotary_dim", [64, 256, 0])
def test_rope_rotates_the_first_channels(dtype, rotary_dim):
    gen = torch.Generator().manual_seed(6)
    packed = randn_on(gen, 5, 4, 2 * 256, dtype=dtype)
    q = packed.chunk(2, dim=-1)[0]  # [b, heads, 256] with a head stride of 512
    pos = torch.tensor([0, 3, 17, 95, 4000], dtype=torch.int64, device=DEV)
    half = rotary_dim // 2
    want = q.double().clone()
    if half:
        inv = 1e7 ** (-torch.arange(half, dtype=torch.float64) / half)
        ang = (pos.cpu().double()[:, None] * inv)[:, None, :].to(DEV)
        x1, x2 = q.double()[..., :half], q.double()[..., half:rotary_dim]
        want[..., :half] = x1 * ang.cos() - x2 * ang.sin()
        want[..., half:rotary_dim] = x2 * ang.cos() + x1 * ang.sin()
    # fp32 angles (as the reference) at position 4000: ~4e-4 absolute
    tol = act_tol(dtype) if dtype == torch.bfloat16 else dict(rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(ops.rope(q, pos, rotary_dim, 1e7).double(), want, **tol)


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("heads,kv_heads,hd,gated", [(40, 8, 128, False), (16, 4, 256, True), (32, 2, 256, True),
                                                      (64, 2, 64, False), (8, 2, 48, True)])  # rep 32; head_dim 48: PyTorch
def test_attention_decode_appends_and_attends(dtype, heads, kv_heads, hd, gated):
    gen = torch.Generator().manual_seed(8)
    b, max_len = 3, 37
    k_cache, v_cache = randn_on(gen, b, kv_heads, max_len, hd, dtype=dtype), randn_on(gen, b, kv_heads, max_len, hd, dtype=dtype)
    k0, v0 = k_cache.clone(), v_cache.clone()
    packed = randn_on(gen, b, heads, 2 * hd, dtype=dtype)
    q, gate = packed.chunk(2, dim=-1)  # strided heads, as the packed q/gate projection gives them
    k = randn_on(gen, b, kv_heads + 1, hd, dtype=dtype)[:, 1:]
    v = randn_on(gen, b, kv_heads, hd, dtype=dtype)
    pos = torch.tensor([0, 17, max_len - 1], dtype=torch.int64, device=DEV)
    out = ops.attention_decode(q, k, v, k_cache, v_cache, pos, hd ** -0.5, gate if gated else None)
    rep = heads // kv_heads
    for row in range(b):
        p = int(pos[row])
        k0[row, :, p], v0[row, :, p] = k[row], v[row]
        torch.testing.assert_close(k_cache[row], k0[row], rtol=0, atol=0)  # only position pos written
        torch.testing.assert_close(v_cache[row], v0[row], rtol=0, atol=0)
        for h in range(heads):
            keys, vals = k0[row, h // rep, :p + 1].double(), v0[row, h // rep, :p + 1].double()
            w = torch.softmax(keys @ q[row, h].double() * hd ** -0.5, 0)
            want = w @ vals
            if gated:
                want = want * torch.sigmoid(gate[row, h].double())
            torch.testing.assert_close(out[row, h * hd:(h + 1) * hd].double(), want, **act_tol(dtype))


@pytest.mark.parametrize("window", [1, 5, 9])
def test_sliding_window_attention_over_a_ring_cache(window):
    """A window of W tokens over a ring of 9 slots (position p in slot p % 9): rows at positions before, at and past
    the ring's first wrap attend exactly to positions max(0, pos - W + 1) .. pos; only the slot of pos is written."""
    gen = torch.Generator().manual_seed(10 + window)
    b, heads, kv_heads, hd, slots = 4, 4, 2, 64, 9
    f32 = torch.float32
    k_cache, v_cache = randn_on(gen, b, kv_heads, slots, hd, dtype=f32), randn_on(gen, b, kv_heads, slots, hd, dtype=f32)
    k0, v0 = k_cache.clone(), v_cache.clone()
    q, k, v = (randn_on(gen, b, n, hd, dtype=f32) for n in (heads, kv_heads, kv_heads))
    pos = torch.tensor([2, 8, 13, 40], dtype=torch.int64, device=DEV)
    out = ops.attention_decode(q, k, v, k_cache, v_cache, pos, hd ** -0.5, window=window)
    rep = heads // kv_heads
    for row in range(b):
        p = int(pos[row])
        k0[row, :, p % slots], v0[row, :, p % slots] = k[row], v[row]
        torch.testing.assert_close(k_cache[row], k0[row], rtol=0, atol=0)
        torch.testing.assert_close(v_cache[row], v0[row], rtol=0, atol=0)
        seen = [a % slots for a in range(max(0, p - window + 1), p + 1)]
        for h in range(heads):
            keys, vals = k0[row, h // rep, seen].double(), v0[row, h // rep, seen].double()
            want = torch.softmax(keys @ q[row, h].double() * hd ** -0.5, 0) @ vals
            torch.testing.assert_close(out[row, h * hd:(h + 1) * hd].double(), want, **act_tol(f32))
    with pytest.raises(ValueError, match="window: expected 0"):
        ops.attention_decode(q, k, v, k_cache, v_cache, pos, 1.0, window=slots + 1)


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("T,window,slots", [(4, 0, 40), (1, 0, 40), (8, 0, 40), (4, 6, 9), (3, 5, 7),
                                            (8, 0, 400)])  # the last: 8 tokens' scores exceed the kernel's 48 KiB
def test_attention_verify_attends_each_token_up_to_its_position(dtype, T, window, slots):
    """A window of T tokens (gated, strided q and keys as the packed projections give them): token t's keys and values
    at position pos + t, its output over the positions up to pos + t (the last `window` of a ring), every other slot
    untouched; rows before, at and past a ring's wrap, a full cache's rows at its start and end; a window too long for
    one launch runs a decode step per token."""
    gen = torch.Generator().manual_seed(T * 10 + window)
    b, heads, kv_heads, hd = 4, 8, 2, 64
    k_cache, v_cache = randn_on(gen, b, kv_heads, slots, hd, dtype=dtype), randn_on(gen, b, kv_heads, slots, hd, dtype=dtype)
    k0, v0 = k_cache.clone(), v_cache.clone()
    q, gate = randn_on(gen, b, T, heads, 2 * hd, dtype=dtype).chunk(2, dim=-1)
    k = randn_on(gen, b, T, kv_heads + 1, hd, dtype=dtype)[:, :, 1:]
    v = randn_on(gen, b, T, kv_heads, hd, dtype=dtype)
    last = slots - T if not window else 40
    pos = torch.tensor([0, 3, 6, last], dtype=torch.int64, device=DEV)
    out = ops.attention_verify(q, k, v, k_cache, v_cache, pos, hd ** -0.5, gate, window)
    rep = heads // kv_heads
    for row in range(b):
        p = int(pos[row])
        for t in range(T):
            k0[row, :, (p + t) % slots], v0[row, :, (p + t) % slots] = k[row, t], v[row, t]
        torch.testing.assert_close(k_cache[row], k0[row], rtol=0, atol=0)
        torch.testing.assert_close(v_cache[row], v0[row], rtol=0, atol=0)
        for t in range(T):
            seen = [a % slots for a in range(max(0, p + t - window + 1) if window else 0, p + t + 1)]
            for h in range(heads):
                keys, vals = k0[row, h // rep, seen].double(), v0[row, h // rep, seen].double()
                want = torch.softmax(keys @ q[row, t, h].double() * hd ** -0.5, 0) @ vals
                want = want * torch.sigmoid(gate[row, t, h].double())
                torch.testing.assert_close(out[row, t, h * hd:(h + 1) * hd].double(), want, **act_tol(dtype))
    with pytest.raises(ValueError, match="q: expected a window of 1 to 8 tokens"):
        ops.attention_verify(torch.zeros(b, 9, heads, hd, dtype=dtype, device=DEV), k, v, k_cache, v_cache, pos, 1.0)
    with pytest.raises(ValueError, match=r"^k: expected shape"):
        ops.attention_verify(q, k[:, :, :1], v, k_cache, v_cache, pos, 1.0)


@pytest.mark.gpu
def test_attention_decode_full_cache_writes_nothing_outside():
    gen = torch.Generator().manual_seed(9)
    b, heads, kv_heads, hd, max_len = 2, 8, 2, 128, 5
    k_cache = randn_on(gen, b, kv_heads, max_len, hd, dtype=torch.bfloat16)
    v_cache = randn_on(gen, b, kv_heads, max_len, hd, dtype=torch.bfloat16)
    guard = torch.zeros(2 * b * kv_heads * max_len * hd, dtype=torch.bfloat16, device=DEV)
    k_view = guard[:k_cache.numel()].view_as(k_cache).copy_(k_cache)  # the cache sits first in a zeroed buffer
    q, k, v = (randn_on(gen, b, n, hd, dtype=torch.bfloat16) for n in (heads, kv_heads, kv_heads))
    pos = torch.tensor([2, max_len], dtype=torch.int64, device=DEV)  # row 1's cache is full
    out = ops.attention_decode(q, k, v, k_view, v_cache, pos, hd ** -0.5)
    assert torch.isnan(out[1]).all() and torch.isfinite(out[0]).all()
    assert not guard[k_cache.numel():].any()  # nothing written past the cache
    torch.testing.assert_close(k_view[1], k_cache[1], rtol=0, atol=0)


def test_bad_inputs_name_the_argument():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="weight"):
        ops.rms_norm(x, torch.ones(32), 1e-5)
    with pytest.raises(ValueError, match="residual"):
        ops.rms_norm(x, torch.ones(64), 1e-5, residual=torch.zeros(4, 32))
    with pytest.raises(ValueError, match="group_size"):
        ops.gated_rms_norm(x, x, torch.ones(64), 48, 1e-5, False)
    with pytest.raises(ValueError, match="weight"):
        ops.gated_rms_norm(x, x, torch.ones(48), 16, 1e-5, False)
    with pytest.raises(ValueError, match="b:"):
        ops.mlp_act(x, None, "swiglu")
    with pytest.raises(ValueError, match="kind"):
        ops.mlp_act(x, None, "gelu")
    with pytest.raises(ValueError, match="kv_heads"):
        ops.attention_decode(x.view(4, 2, 32), x.view(4, 2, 32)[:, :1], x.view(4, 2, 32)[:, :1],
                             torch.zeros(4, 3, 8, 32), torch.zeros(4, 3, 8, 32), torch.zeros(4, dtype=torch.int64), 1.0)
    with pytest.raises(ValueError, match="rotary_dim"):
        ops.rope(x.view(4, 2, 32), torch.zeros(4, dtype=torch.int64), 33, 1e4)
    with pytest.raises(ValueError, match="pos"):
        ops.rope(x.view(4, 2, 32), torch.zeros(3, dtype=torch.int64), 32, 1e4)
