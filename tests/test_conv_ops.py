"""The conv1d decode step (core/ops/conv.py) against float64 math written out here: the CUDA kernel on a GPU (vector
and element paths), the PyTorch reference (its CPU path) without one; on a pool indexed by slot ids as the TensorRT-LLM
module runs it (strided slots, pad rows, rows outside the pool, outputs poisoned beforehand)."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import ACT_DTYPES, DEV, act_tol, randn_on, silu64
from trtllm_replayssm.core.ops import conv

pytestmark = pytest.mark.kernels


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("width,bias,silu", [(4, True, True), (4, False, True), (3, True, False), (2, False, False)])
@pytest.mark.parametrize("channels,offset", [(304, 0), (300, 3)])  # vector path (width 4) / element path
def test_conv1d_update_steps_a_sliding_window(dtype, width, bias, silu, channels, offset):
    gen = torch.Generator().manual_seed(4)
    batch = 5
    weight = randn_on(gen, channels, 1, width, dtype=dtype)
    b = randn_on(gen, channels, dtype=dtype) if bias else None
    state = randn_on(gen, batch, channels, width - 1, dtype=dtype)
    window = state.double()
    for _ in range(6):
        x = randn_on(gen, batch, channels + 8, dtype=dtype)[:, offset:offset + channels]  # row-strided input
        window = torch.cat([window, x.double().unsqueeze(-1)], -1)
        y = (window * weight[:, 0].double()).sum(-1) + (b.double() if bias else 0)
        want = silu64(y) if silu else y
        got = conv.conv1d_update(x, state, weight, b, silu)
        torch.testing.assert_close(got.double(), want, **act_tol(dtype))
        window = window[:, :, 1:]
        torch.testing.assert_close(state.double(), window, rtol=0, atol=0)


@pytest.mark.parametrize("dtype", ACT_DTYPES)
@pytest.mark.parametrize("width,channels", [(4, 304), (4, 300), (3, 304)])  # vector path / element paths
@pytest.mark.parametrize("round_once", [False, True])
def test_conv1d_update_on_a_strided_slot_pool(dtype, width, channels, round_once):
    """The served form: a pool of 7 slots inside a wider buffer (slot stride beyond channels x taps, as in
    TensorRT-LLM's unified pool), rows on scattered slots, a pad row and (on CUDA) a row outside the pool, outputs
    poisoned: the live rows' outputs and slots match float64 math over several steps, everything else is untouched."""
    gen = torch.Generator().manual_seed(11)
    slots, batch, pad = 7, 4, -1
    weight = randn_on(gen, channels, width, dtype=dtype)
    bias = randn_on(gen, channels, dtype=dtype)
    buffer = randn_on(gen, slots, channels * (width - 1) + 64, dtype=dtype)
    pool = buffer[:, 16:16 + channels * (width - 1)].unflatten(1, (channels, width - 1))
    ids = [5, pad, 0, 3] + ([slots] if DEV == "cuda" else [pad])  # CUDA skips an id outside the pool
    idx = torch.tensor(ids, dtype=torch.int32, device=DEV)
    rows = batch + 1
    live = {r: s for r, s in enumerate(ids) if 0 <= s < slots}
    window = {r: pool[s].double() for r, s in live.items()}
    before = buffer.clone()
    for _ in range(3):
        x = randn_on(gen, rows, channels, dtype=dtype)
        out = torch.full((rows, channels), float("nan"), dtype=dtype, device=DEV)
        got = conv.conv1d_update(x, pool, weight, bias, True, state_indices=idx, pad_slot_id=pad, out=out,
                                 round_once=round_once)
        assert got is out
        for r in range(rows):
            if r not in live:
                assert torch.isnan(out[r].float()).all(), f"row {r} (id {ids[r]}) was written"
                continue
            window[r] = torch.cat([window[r], x[r].double().unsqueeze(-1)], -1)
            y = (window[r] * weight.double()).sum(-1) + bias.double()
            torch.testing.assert_close(out[r].double(), silu64(y), **act_tol(dtype))
            window[r] = window[r][:, 1:]
            torch.testing.assert_close(pool[live[r]].double(), window[r], rtol=0, atol=0)
    untouched = [s for s in range(slots) if s not in live.values()]
    assert torch.equal(buffer[untouched], before[untouched])
    assert torch.equal(buffer[:, :16], before[:, :16]) and torch.equal(buffer[:, 16 + channels * (width - 1):],
                                                                       before[:, 16 + channels * (width - 1):])


def test_round_once_rounds_only_the_activation():
    """round_once: the SiLU of the fp32 conv, rounded once (TensorRT-LLM's causal_conv1d_update); otherwise the conv
    is rounded to the activation dtype before the SiLU (the reference decoders). The two differ on bf16 inputs."""
    gen = torch.Generator().manual_seed(2)
    x = randn_on(gen, 64, 256, dtype=torch.bfloat16)
    weight = randn_on(gen, 256, 4, dtype=torch.bfloat16)
    state = randn_on(gen, 64, 256, 3, dtype=torch.bfloat16)
    window = torch.cat([state.float(), x.float().unsqueeze(-1)], -1)
    y = (window * weight.float()).sum(-1)
    once = conv.conv1d_update(x, state.clone(), weight, None, True, round_once=True)
    twice = conv.conv1d_update(x, state.clone(), weight, None, True)
    assert torch.equal(once, (y / (1 + torch.exp(-y))).to(torch.bfloat16))
    assert not torch.equal(once, twice)


def test_bad_inputs_name_the_argument():
    x = torch.randn(4, 64)
    with pytest.raises(ValueError, match="weight"):
        conv.conv1d_update(x, torch.zeros(4, 64, 9), torch.ones(64, 1, 10))
    with pytest.raises(ValueError, match="conv_state"):
        conv.conv1d_update(x, torch.zeros(4, 64, 2), torch.ones(64, 1, 4))
    with pytest.raises(TypeError, match="conv_state"):
        conv.conv1d_update(x, torch.zeros(4, 64, 3, dtype=torch.bfloat16), torch.ones(64, 4))
    with pytest.raises(TypeError, match="state_indices"):
        conv.conv1d_update(x, torch.zeros(6, 64, 3), torch.ones(64, 4), state_indices=torch.arange(4))
    with pytest.raises(ValueError, match="state_indices"):
        conv.conv1d_update(x, torch.zeros(6, 64, 3), torch.ones(64, 4),
                           state_indices=torch.tensor([0, 6, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="state_indices"):
        conv.conv1d_update(x, torch.zeros(6, 64, 3), torch.ones(64, 4),
                           state_indices=torch.tensor([0, 1, 1, 2], dtype=torch.int32))
    with pytest.raises(ValueError, match="out"):
        conv.conv1d_update(x, torch.zeros(4, 64, 3), torch.ones(64, 4), out=torch.empty(4, 32))
