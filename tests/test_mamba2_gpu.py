"""Mamba-2 kernel contract against the float64 sequential recurrence: cursors, pad rows, flushes, drift (CUDA kernels on
a GPU, the CPU reference ops without one); CUDA graphs and the sanitizer smoke test need a GPU."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import assert_rows_written, check_back_to_back, rel_err
from mamba2_helpers import Float64Sequential, make_params, make_step
from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.ops import launch as _launch
from trtllm_replayssm.core.ops import mamba2 as ops

pytestmark = pytest.mark.kernels
# The CUDA kernels on a GPU; without one, the same contract checks run the CPU reference ops (the CPU fallback).
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _args(step, params):
    return dict(x=step["x"], dt=step["dt"], A=params.A, B=step["B"], C=step["C"], D=params.D, z=step["z"],
                dt_bias=params.dt_bias, dt_softplus=True)


def _setup(nheads, head_dim, d_state, ngroups, L, state_dtype, act_dtype, slots=9, seed=0):
    gen = torch.Generator().manual_seed(seed)
    cache = ReplayStateCache.mamba2(1, slots, nheads, head_dim, d_state, ngroups, buffer_len=L,
                                    state_dtype=state_dtype, act_dtype=act_dtype, device=DEV)
    layer = cache.layer(0)
    init = torch.randn(slots, nheads, head_dim, d_state, generator=gen).to(DEV)
    layer.state.copy_(init)
    return gen, cache, layer, Float64Sequential(layer.state.float()), make_params(nheads, DEV, gen)


# (nheads, head_dim, d_state, ngroups, L)
SHAPES = [(16, 80, 128, 8, 16), (16, 64, 128, 8, 8), (8, 128, 256, 1, 32), (8, 64, 64, 1, 16), (4, 80, 128, 1, 1)]


@pytest.mark.parametrize("nheads,head_dim,d_state,ngroups,L", SHAPES)
@pytest.mark.parametrize("mode,persist,fraction", [("replay", None, 0.1), ("replay", (1, 2), None),
                                                   ("replay", (1, 2), 1.0), ("auto", None, 0.1)])
def test_replay_fp32_matches_float64(nheads, head_dim, d_state, ngroups, L, mode, persist, fraction, monkeypatch):
    """persist=(1, 2): one CTA per SM with two tile stages, so every CTA streams many tiles and reuses each stage
    (barrier phases wrap), its tiles assigned round-robin (fraction None) or, after the first wave, claimed at run
    time (1.0); None: the launch plan."""
    monkeypatch.setattr(_launch, "PERSISTENT_OVERRIDE", persist)
    monkeypatch.setattr(ops, "TAIL_FRACTION", fraction)
    gen, cache, layer, truth, params = _setup(nheads, head_dim, d_state, ngroups, L, "fp32", torch.float32)
    slot_ids = [5, -1, 0, 8, 3, -1, 7]           # pad rows between real rows
    idx = torch.tensor(slot_ids, dtype=torch.int32, device=DEV)
    real = [s for s in slot_ids if s >= 0]
    for r, s in enumerate(real):                 # staggered cursors
        for _ in range((r * 5) % max(L, 1)):
            one = make_step(1, nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen)
            ops.replay_decode(layer, **_args(one, params), state_batch_indices=idx[slot_ids.index(s):][:1],
                              mode="replay")
            truth.step([s], one, params)
    untouched_slots = [1, 2, 4, 6]
    frozen = {k: v[untouched_slots].clone() for k, v in layer.slot_tensors().items()}
    worst_out = worst_state = 0.0
    flushes = 0
    for _ in range(3 * L + 3):
        step = make_step(len(slot_ids), nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen)
        out = torch.full_like(step["x"], float("nan"))
        before = layer.cursor.clone()
        ops.replay_decode(layer, **_args(step, params), state_batch_indices=idx, out=out, mode=mode)
        expected = truth.step(slot_ids, step, params)
        assert_rows_written(out, slot_ids)
        rows = [r for r, s in enumerate(slot_ids) if s >= 0]
        worst_out = max(worst_out, rel_err(out[rows], expected[rows]))
        for s in real:
            if int(before[s]) == L - 1 or int(layer.cursor[s]) == 0:
                flushes += 1
                worst_state = max(worst_state, rel_err(layer.state[s], truth.states[s]))
    for k, v in layer.slot_tensors().items():
        assert torch.equal(v[untouched_slots], frozen[k]), f"{k} of an unaddressed slot changed"
    print(f"max rel err out {worst_out:.2e} state {worst_state:.2e} ({flushes} flush checks)")
    assert flushes > 0
    assert worst_out <= 1e-5 and worst_state <= 1e-5


@pytest.mark.parametrize("state_dtype,act_dtype,bound", [
    ("fp32", torch.bfloat16, 1e-2), ("bf16", torch.bfloat16, 3e-2), ("fp16", torch.float16, 1e-2),
])
def test_low_precision_bounds(state_dtype, act_dtype, bound):
    """bf16/fp16 outputs round to ~4e-3 (bf16) / 5e-4 (fp16) relative; a bf16 checkpoint adds its rounding at each
    flush (the replay rounds the state once per L steps, the baseline every step)."""
    nheads, head_dim, d_state, ngroups, L = 16, 80, 128, 8, 16
    gen, cache, layer, truth, params = _setup(nheads, head_dim, d_state, ngroups, L, state_dtype, act_dtype)
    base_pool = layer.state.clone()
    base_truth = Float64Sequential(layer.state.float())
    slot_ids = [0, 3, 6, 8]
    idx = torch.tensor(slot_ids, dtype=torch.int32, device=DEV)
    worst_replay = worst_base = 0.0
    for _ in range(4 * L):
        step = make_step(len(slot_ids), nheads, head_dim, d_state, ngroups, act_dtype, DEV, gen)
        y = ops.replay_decode(layer, **_args(step, params), state_batch_indices=idx, mode="replay")
        yb = ops.state_update(base_pool, **_args(step, params), state_batch_indices=idx)
        worst_replay = max(worst_replay, rel_err(y, truth.step(slot_ids, step, params)))
        worst_base = max(worst_base, rel_err(yb, base_truth.step(slot_ids, step, params)))
    print(f"{state_dtype}/{act_dtype}: replay {worst_replay:.2e} baseline {worst_base:.2e}")
    assert worst_replay <= bound and worst_base <= bound


@pytest.mark.parametrize("nheads,head_dim,d_state,ngroups", [(16, 80, 128, 8), (8, 64, 128, 2)])
def test_baseline_kernel_matches_float64(nheads, head_dim, d_state, ngroups):
    gen, cache, layer, truth, params = _setup(nheads, head_dim, d_state, ngroups, 1, "fp32", torch.float32)
    slot_ids = [2, -1, 7, 4]
    idx = torch.tensor(slot_ids, dtype=torch.int32, device=DEV)
    for _ in range(20):
        step = make_step(4, nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen)
        out = torch.full_like(step["x"], float("nan"))
        ops.state_update(layer.state, **_args(step, params), state_batch_indices=idx, out=out)
        expected = truth.step(slot_ids, step, params)
        assert torch.isnan(out[1]).all()
        assert rel_err(out[[0, 2, 3]], expected[[0, 2, 3]]) <= 1e-5
    assert rel_err(layer.state[[2, 7, 4]], truth.states[[2, 7, 4]]) <= 1e-5


def test_flush_mode_equals_baseline():
    gen, cache, layer, truth, params = _setup(16, 80, 128, 8, 16, "fp32", torch.bfloat16)
    pool = layer.state.clone()
    idx = torch.tensor([1, 4, 6], dtype=torch.int32, device=DEV)
    for _ in range(10):
        step = make_step(3, 16, 80, 128, 8, torch.bfloat16, DEV, gen)
        y = ops.replay_decode(layer, **_args(step, params), state_batch_indices=idx, mode="flush")
        yb = ops.state_update(pool, **_args(step, params), state_batch_indices=idx)
        torch.testing.assert_close(layer.state, pool, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(y, yb, rtol=1e-2, atol=1e-2)
    assert int(layer.cursor.abs().sum()) == 0


def test_paged_slot_stride():
    """States and rings that are views into a larger per-slot page (slot stride != dense size)."""
    gen = torch.Generator().manual_seed(5)
    nheads, head_dim, d_state, ngroups, L, slots = 8, 64, 128, 2, 8, 5
    dense = ReplayStateCache.mamba2(1, slots, nheads, head_dim, d_state, ngroups, buffer_len=L,
                                    act_dtype=torch.float32, device=DEV)
    page = torch.randn(slots, nheads + 3, head_dim, d_state, generator=gen).to(DEV)
    paged = ReplayStateCache.mamba2(1, slots, nheads, head_dim, d_state, ngroups, buffer_len=L,
                                    act_dtype=torch.float32, device=DEV)
    paged.layer(0).state = page[:, 1:nheads + 1]
    dense.layer(0).state.copy_(page[:, 1:nheads + 1])
    params = make_params(nheads, DEV, gen)
    idx = torch.tensor([3, 0], dtype=torch.int32, device=DEV)
    for _ in range(2 * L + 1):
        step = make_step(2, nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen)
        y1 = ops.replay_decode(dense.layer(0), **_args(step, params), state_batch_indices=idx, mode="replay")
        y2 = ops.replay_decode(paged.layer(0), **_args(step, params), state_batch_indices=idx, mode="replay")
        torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    torch.testing.assert_close(dense.layer(0).state, page[:, 1:nheads + 1], rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("claimed", [False, True])
def test_cuda_graph_l_cycle_matches_eager(claimed, monkeypatch):
    """Graph replay equals eager bit for bit; claimed: one CTA per SM, two stages, 8-row tiles, every tile after the
    first wave claimed at run time."""
    if claimed:
        monkeypatch.setattr(ops, "TAIL_FRACTION", 1.0)
        monkeypatch.setattr(_launch, "PERSISTENT_OVERRIDE", (1, 2))
        monkeypatch.setattr(ops, "ROWS_PER_CTA_OVERRIDE", 8)
    nheads, head_dim, d_state, ngroups, L = 16, 80, 128, 8, 16
    gen, cache, layer, _, params = _setup(nheads, head_dim, d_state, ngroups, L, "fp32", torch.bfloat16)
    twin = ReplayStateCache.mamba2(1, cache.slots, nheads, head_dim, d_state, ngroups, buffer_len=L, device=DEV)
    for k, v in layer.tensors().items():
        getattr(twin.layer(0), k).copy_(v)
    batch = 6
    idx = torch.tensor([0, 2, 3, 5, 7, 8], dtype=torch.int32, device=DEV)
    layer.cursor[idx.long()] = torch.arange(batch, dtype=torch.int32, device=DEV) * 3 % L  # staggered
    twin.layer(0).cursor.copy_(layer.cursor)
    static = [make_step(batch, nheads, head_dim, d_state, ngroups, torch.bfloat16, DEV, gen) for _ in range(L)]
    outs = [torch.empty_like(s["x"]) for s in static]
    scratch = ReplayStateCache.mamba2(1, cache.slots, nheads, head_dim, d_state, ngroups, buffer_len=L, device=DEV)
    ops.replay_decode(scratch.layer(0), **_args(static[0], params), state_batch_indices=idx, mode="replay")  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s, o in zip(static, outs):
            ops.replay_decode(twin.layer(0), **_args(s, params), state_batch_indices=idx, out=o, mode="replay")
    for k, v in layer.tensors().items():  # capture does not run kernels; reset the twin anyway
        getattr(twin.layer(0), k).copy_(v)
    for _cycle in range(2):
        fresh = [make_step(batch, nheads, head_dim, d_state, ngroups, torch.bfloat16, DEV, gen) for _ in range(L)]
        for s, f in zip(static, fresh):
            for key in s:
                if s[key] is not None:
                    s[key].copy_(f[key])
        graph.replay()
        for f, o in zip(fresh, outs):
            y = ops.replay_decode(layer, **_args(f, params), state_batch_indices=idx, mode="replay")
            torch.testing.assert_close(o, y, rtol=0, atol=0)
        for k, v in layer.tensors().items():
            torch.testing.assert_close(getattr(twin.layer(0), k), v, rtol=0, atol=0)


@pytest.mark.gpu
def test_back_to_back_steps_match_float64():
    """Steps launched back to back, inputs drawn and outputs poisoned first: each step's prep kernel follows the
    previous step's main kernel directly (its programmatic dependent), as in a decode loop. Every output and each
    slot's final checkpoint against float64."""
    nheads, head_dim, d_state, ngroups, L = 16, 80, 128, 8, 8
    gen, cache, layer, truth, params = _setup(nheads, head_dim, d_state, ngroups, L, "fp32", torch.float32)
    slot_ids = [5, -1, 0, 8, 3]
    idx = torch.tensor(slot_ids, dtype=torch.int32, device=DEV)
    real = [s for s in slot_ids if s >= 0]
    for r, s in enumerate(real):  # staggered cursors
        for _ in range((3 * r) % L):
            one = make_step(1, nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen)
            ops.replay_decode(layer, **_args(one, params), state_batch_indices=idx[slot_ids.index(s):][:1],
                              mode="replay")
            truth.step([s], one, params)
    steps = 3 * L + 5
    xs = [make_step(len(slot_ids), nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen) for _ in range(steps)]
    check_back_to_back(
        lambda x, out: ops.replay_decode(layer, **_args(x, params), state_batch_indices=idx, out=out, mode="replay"),
        lambda x: truth.step(slot_ids, x, params), lambda: truth.states, xs,
        [torch.full_like(x["x"], float("nan")) for x in xs], slot_ids, layer.state, layer.cursor)


def test_drift_10000_steps_bounded():
    nheads, head_dim, d_state, ngroups, L = 4, 64, 128, 1, 16
    gen, cache, layer, truth, params = _setup(nheads, head_dim, d_state, ngroups, L, "fp32", torch.float32, slots=3)
    idx = torch.tensor([0, 2], dtype=torch.int32, device=DEV)
    layer.cursor[2] = 7
    worst = 0.0
    for t in range(10_000):
        step = make_step(2, nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen)
        ops.replay_decode(layer, **_args(step, params), state_batch_indices=idx, mode="replay")
        truth.step([0, 2], step, params)
        if t % 500 == 499:
            for s in (0, 2):
                if int(layer.cursor[s]) == 0:
                    worst = max(worst, rel_err(layer.state[s], truth.states[s]))
    print(f"10k-step worst checkpoint rel err {worst:.2e}")
    assert worst <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("fraction", [None, 1.0])
def test_sanitizer_smoke(fraction, monkeypatch):
    """Small mixed batch (flush + non-flush + pad rows), run under compute-sanitizer by build_scripts/gpu_check.sh; one
    CTA per SM with two stages, tiles assigned round-robin or, after the first wave, claimed at run time."""
    monkeypatch.setattr(ops, "TAIL_FRACTION", fraction)
    monkeypatch.setattr(_launch, "PERSISTENT_OVERRIDE", (1, 2))
    monkeypatch.setattr(ops, "ROWS_PER_CTA_OVERRIDE", 8)
    gen, cache, layer, truth, params = _setup(8, 80, 128, 2, 4, "fp32", torch.bfloat16, slots=4)
    idx = torch.tensor([3, -1, 0], dtype=torch.int32, device=DEV)
    layer.cursor[3] = 3
    for _ in range(5):
        step = make_step(3, 8, 80, 128, 2, torch.bfloat16, DEV, gen)
        ops.replay_decode(layer, **_args(step, params), state_batch_indices=idx, mode="replay")
        ops.state_update(layer.state, **_args(step, params), state_batch_indices=idx)
    torch.cuda.synchronize()
