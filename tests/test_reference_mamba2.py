"""CPU: the float32 replay reference (the ops' CPU fallback) equals the float64 sequential Mamba-2 recurrence."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import rel_err
from mamba2_helpers import Float64Sequential, make_params, make_step
from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.ops import mamba2 as ops

# (head_dim, d_state, ngroups, nheads, L): every head_dim/d_state/ngroups/L value of the issue appears.
CASES = [
    (64, 128, 8, 8, 16), (80, 128, 8, 8, 8), (128, 64, 1, 4, 32), (80, 256, 1, 4, 16),
    (64, 256, 8, 8, 1), (128, 128, 1, 2, 8), (80, 64, 8, 16, 32),
]


@pytest.mark.parametrize("head_dim,d_state,ngroups,nheads,L", CASES)
def test_replay_matches_float64_sequential(head_dim, d_state, ngroups, nheads, L):
    gen = torch.Generator().manual_seed(head_dim * 1000 + d_state + L)
    slots, batch = 5, 3
    cache = ReplayStateCache.mamba2(1, slots, nheads, head_dim, d_state, ngroups, buffer_len=L, state_dtype="fp32",
                                    act_dtype=torch.float32, device="cpu")
    layer = cache.layer(0)
    init = torch.randn(slots, nheads, head_dim, d_state, generator=gen)
    layer.state.copy_(init)
    truth = Float64Sequential(init)
    params = make_params(nheads, "cpu", gen)
    slot_ids = [3, 0, 4]
    idx = torch.tensor(slot_ids, dtype=torch.int32)
    # Staggered cursors: row r starts r steps into its cycle (row-only warm-up steps).
    for r in range(batch):
        for _ in range(r * max(1, L // 3)):
            one = make_step(1, nheads, head_dim, d_state, ngroups, torch.float32, "cpu", gen)
            ops.replay_decode(layer, **_args(one, params), state_batch_indices=idx[r:r + 1], mode="replay")
            truth.step([slot_ids[r]], one, params)
    assert len(set(layer.cursor[idx.long()].tolist())) > 1 or L == 1
    worst_out, worst_state = 0.0, 0.0
    for _ in range(3 * L + 2):
        step = make_step(batch, nheads, head_dim, d_state, ngroups, torch.float32, "cpu", gen)
        cursors_before = layer.cursor.clone()
        out = ops.replay_decode(layer, **_args(step, params), state_batch_indices=idx, mode="replay")
        expected = truth.step(slot_ids, step, params)
        worst_out = max(worst_out, rel_err(out, expected))
        for s in slot_ids:  # state parity at every flush
            if int(cursors_before[s]) == L - 1:
                worst_state = max(worst_state, rel_err(layer.state[s], truth.states[s]))
    assert worst_out < 1e-5, worst_out
    assert worst_state < 1e-5, worst_state


def _args(step, params):
    return dict(x=step["x"], dt=step["dt"], A=params.A, B=step["B"], C=step["C"], D=params.D, z=step["z"],
                dt_bias=params.dt_bias, dt_softplus=True)


def test_l1_equals_baseline_step_exactly():
    gen = torch.Generator().manual_seed(7)
    nheads, head_dim, d_state, ngroups = 4, 16, 64, 2
    cache = ReplayStateCache.mamba2(1, 3, nheads, head_dim, d_state, ngroups, buffer_len=1, act_dtype=torch.bfloat16,
                                    device="cpu")
    layer = cache.layer(0)
    layer.state.copy_(torch.randn(layer.state.shape, generator=gen))
    pool = layer.state.clone()
    params = make_params(nheads, "cpu", gen)
    idx = torch.tensor([2, 0], dtype=torch.int32)
    for _ in range(3):
        step = make_step(2, nheads, head_dim, d_state, ngroups, torch.bfloat16, "cpu", gen)
        y_replay = ops.replay_decode(layer, **_args(step, params), state_batch_indices=idx)
        y_base = ops.state_update(pool, **_args(step, params), state_batch_indices=idx)
        torch.testing.assert_close(layer.state, pool, rtol=2e-6, atol=2e-6)
        torch.testing.assert_close(y_replay, y_base, rtol=1e-2, atol=1e-2)
    assert layer.cursor.tolist() == [0, 0, 0]


def test_pad_rows_and_other_slots_untouched():
    gen = torch.Generator().manual_seed(11)
    cache = ReplayStateCache.mamba2(1, 4, 4, 16, 64, 1, buffer_len=4, act_dtype=torch.bfloat16, device="cpu")
    layer = cache.layer(0)
    layer.state.copy_(torch.randn(layer.state.shape, generator=gen))
    before = {k: v.clone() for k, v in layer.tensors().items()}
    params = make_params(4, "cpu", gen)
    step = make_step(3, 4, 16, 64, 1, torch.bfloat16, "cpu", gen)
    out = torch.full_like(step["x"], float("nan"))
    idx = torch.tensor([-1, 2, -1], dtype=torch.int32)
    ops.replay_decode(layer, **_args(step, params), state_batch_indices=idx, out=out)
    assert (out[0] == 0).all() and (out[2] == 0).all() and not torch.isnan(out[1]).any()
    for name, t in layer.tensors().items():
        untouched = [0, 1, 3]
        assert torch.equal(t[untouched], before[name][untouched]), name
    assert layer.cursor.tolist() == [0, 0, 1, 0]


def test_bad_input_errors_name_the_argument():
    cache = ReplayStateCache.mamba2(1, 4, 4, 16, 64, 2, buffer_len=4, device="cpu")
    layer = cache.layer(0)
    gen = torch.Generator().manual_seed(0)
    params = make_params(4, "cpu", gen)
    step = make_step(2, 4, 16, 64, 2, torch.bfloat16, "cpu", gen)
    with pytest.raises(ValueError, match=r"^x: expected shape \[\*, 4, 16\]"):
        ops.replay_decode(layer, **{**_args(step, params), "x": step["x"][:, :3]})
    with pytest.raises(TypeError, match=r"^A: expected dtype"):
        ops.replay_decode(layer, **{**_args(step, params), "A": params.A.double()})
    big = make_step(5, 4, 16, 64, 2, torch.bfloat16, "cpu", gen)
    with pytest.raises(ValueError, match=r"^x: batch 5 exceeds the cache's 4 slots"):
        ops.replay_decode(layer, **_args(big, params), state_batch_indices=torch.tensor([0, 1, 2, 3, -1],
                                                                                         dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^state_batch_indices: values must be in \[0, 4\)"):
        ops.replay_decode(layer, **_args(step, params), state_batch_indices=torch.tensor([1, 9], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^B: expected shape"):
        ops.replay_decode(layer, **{**_args(step, params), "B": step["B"][:, :, :32]})
    with pytest.raises(ValueError, match=r"^mode:"):
        ops.replay_decode(layer, **_args(step, params), mode="fast")
    with pytest.raises(ValueError, match=r"^buffer_len:"):
        ReplayStateCache.mamba2(1, 4, 4, 16, 64, 2, buffer_len=33, device="cpu")
    with pytest.raises(ValueError, match=r"^x: the last 1 dim\(s\) must be contiguous"):
        ops.replay_decode(layer, **{**_args(step, params), "x": step["x"].transpose(1, 2).contiguous().transpose(1, 2)})


def test_prefill_handoff_and_reset():
    gen = torch.Generator().manual_seed(3)
    cache = ReplayStateCache.mamba2(2, 4, 4, 16, 64, 2, buffer_len=8, device="cpu")
    cache.cursor.fill_(5)
    states = torch.randn(2, 4, 16, 64, generator=gen)
    cache.load_prefill_state(1, [3, 1], states)
    assert torch.equal(cache.layer(1).state[3], states[0]) and torch.equal(cache.layer(1).state[1], states[1])
    assert cache.cursor.tolist() == [[5, 5, 5, 5], [5, 0, 5, 0]]
    cache.reset_slots([2])
    assert cache.cursor.tolist() == [[5, 5, 0, 5], [5, 0, 0, 0]]
    per_layer = 4 * 16 * 64 * 4 + 8 * (4 * 16 * 2 + 4 * 4 + 2 * 64 * 2) + 8
    shared_scratch = 4 * (8 + 1) * 4 + 4  # coef [H, L+1] fp32 + step int32, once per cache
    assert cache.bytes_per_slot() == 2 * per_layer + shared_scratch


def test_persistent_stage_plan_fits_every_preset():
    """The persistent replay kernel's launch plan: some row tile of every Mamba-2 preset leaves >= 2 shared-memory
    stages per CTA at the planned CTAs per SM, for fp32/bf16 states and L up to 32."""
    from trtllm_replayssm.core.jit.configs import tile_choices
    from trtllm_replayssm.core.layouts import mamba2_stage_bytes
    from trtllm_replayssm.core.plans import Tuning, stages_for
    from trtllm_replayssm.serving.presets import PRESETS

    shapes = {(s.ssm_dims.head_dim, s.ssm_dims.d_state) for s in PRESETS.values() if s.family == "mamba2"}
    assert shapes
    for head_dim, d_state in shapes:
        for state_elem in (4, 2):
            for L in (1, 16, 32):
                fits = [t for t in tile_choices(head_dim, d_state)
                        if stages_for(mamba2_stage_bytes(L, t, d_state, state_elem * d_state, 2, head_dim),
                                      Tuning().ctas_per_sm) >= 2]
                assert fits, (head_dim, d_state, state_elem, L)
    # layouts by hand, Super-120B, L = 16. fp32, 64-row tile: tile 32768 + info 16 (D a word of it) + coef 80 + x, z 128 each
    # + C 256 + ring 2048 bytes. NVFP4 (76 bytes a row), two heads: tile 9728 + 16 + 16 + coef 144 + x, z 256 each +
    # C 256 + two rings of 2048.
    assert mamba2_stage_bytes(16, 64, 128, 4 * 128, 2, 64) == 35456
    assert mamba2_stage_bytes(16, 128, 128, 76, 2, 64) == (9728 + 16 + 16 + 144 + 256 + 256 + 256 + 4096 + 127) // 128 * 128
