"""Mamba-2 kernel contract against the float64 sequential recurrence: cursors, pad rows, flushes, drift (CUDA kernels on
a GPU, the CPU reference ops without one); CUDA graphs and the sanitizer smoke test need a GPU."""
from __future__ import annotations

import pytest
import torch

from kernel_checks import assert_rows_written, check_back_to_back, rel_err
from mamba2_helpers import Float64Sequential, make_params, make_step
from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.ops import mamba2 as ops
from trtllm_replayssm.core.plans import Tuning

pytestmark = pytest.mark.kernels
# The CUDA kernels on a GPU; without one, the same contract checks run the CPU reference ops (the CPU fallback).
DEV = "cuda" if torch.cuda.is_available() else "cpu"


def _args(step, params):
    return dict(x=step["x"], dt=step["dt"], A=params.A, B=step["B"], C=step["C"], D=params.D, z=step["z"],
                dt_bias=params.dt_bias, dt_softplus=True)


def decode(layer, step, params, idx, mode="replay", out=None, tuning=Tuning()):
    """One replay_decode step with the plan ``tuning`` gives."""
    plan = ops.replay_plan(layer, idx.shape[0], mode, tuning)
    return ops.replay_decode(layer, **_args(step, params), state_batch_indices=idx, out=out, plan=plan)


def update(state, step, params, idx, out=None, tuning=Tuning()):
    """One baseline state_update step with the plan ``tuning`` gives."""
    plan = ops.state_update_plan(state, idx.shape[0], step["x"].dtype, tuning)
    return ops.state_update(state, **_args(step, params), state_batch_indices=idx, out=out, plan=plan)


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
@pytest.mark.parametrize("mode,tuning", [
    ("replay", Tuning()), ("replay", Tuning(ctas_per_sm=1, stages=2, tail_fraction=None)),
    ("replay", Tuning(ctas_per_sm=1, stages=2, tail_fraction=1.0)), ("auto", Tuning()), ("fused", Tuning()),
    ("fused/replay/fused/fused/flush", Tuning())])
def test_replay_fp32_matches_float64(nheads, head_dim, d_state, ngroups, L, mode, tuning):
    """ctas_per_sm=1, stages=2: every CTA streams many tiles and reuses each stage (barrier phases wrap), its tiles
    assigned round-robin (tail_fraction None) or, after the first wave, claimed at run time (1.0); Tuning(): the
    shipped plan. Modes joined by '/' take turns step by step (the kernels share the rings and cursors)."""
    _check_replay_fp32(nheads, head_dim, d_state, ngroups, L, mode, tuning)


@pytest.mark.parametrize("nheads,head_dim,d_state,ngroups,L,heads_per_cta,stages", [
    (16, 80, 128, 8, 16, 2, 2), (16, 64, 128, 2, 8, 8, 3), (8, 64, 64, 1, 16, 8, 2), (4, 80, 128, 1, 1, 4, 2),
    (8, 64, 128, 1, 16, 1, None)])
@pytest.mark.parametrize("mode", ["fused", "fused/replay/fused/flush"])
def test_fused_stream_matches_float64(nheads, head_dim, d_state, ngroups, L, heads_per_cta, stages, mode):
    """The streaming one-launch replay: several heads per CTA through fewer stages than heads (the barrier phases
    wrap: 8 heads through 3 stages), one head per CTA, every step a flush (L = 1), and turns with the other modes."""
    _check_replay_fp32(nheads, head_dim, d_state, ngroups, L, mode,
                       Tuning(fused_heads_per_cta=heads_per_cta, stages=stages))


def _check_replay_fp32(nheads, head_dim, d_state, ngroups, L, mode, tuning):
    """Staggered cursors, pad rows between real rows, poisoned outputs, 3 L + 3 steps: outputs and every flushed
    checkpoint against float64; the slots no row addresses stay untouched."""
    gen, cache, layer, truth, params = _setup(nheads, head_dim, d_state, ngroups, L, "fp32", torch.float32)
    slot_ids = [5, -1, 0, 8, 3, -1, 7]           # pad rows between real rows
    idx = torch.tensor(slot_ids, dtype=torch.int32, device=DEV)
    real = [s for s in slot_ids if s >= 0]
    for r, s in enumerate(real):                 # staggered cursors
        for _ in range((r * 5) % max(L, 1)):
            one = make_step(1, nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen)
            decode(layer, one, params, idx[slot_ids.index(s):][:1], tuning=tuning)
            truth.step([s], one, params)
    untouched_slots = [1, 2, 4, 6]
    frozen = {k: v[untouched_slots].clone() for k, v in layer.slot_tensors().items()}
    worst_out = worst_state = 0.0
    flushes = 0
    modes = mode.split("/")
    for k in range(3 * L + 3):
        step = make_step(len(slot_ids), nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen)
        out = torch.full_like(step["x"], float("nan"))
        before = layer.cursor.clone()
        decode(layer, step, params, idx, modes[k % len(modes)], out, tuning)
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
        y = decode(layer, step, params, idx)
        yb = update(base_pool, step, params, idx)
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
        update(layer.state, step, params, idx, out)
        expected = truth.step(slot_ids, step, params)
        assert (out[1] == 0).all()  # the pad row: zeros
        assert rel_err(out[[0, 2, 3]], expected[[0, 2, 3]]) <= 1e-5
    assert rel_err(layer.state[[2, 7, 4]], truth.states[[2, 7, 4]]) <= 1e-5


def test_flush_mode_equals_baseline():
    gen, cache, layer, truth, params = _setup(16, 80, 128, 8, 16, "fp32", torch.bfloat16)
    pool = layer.state.clone()
    idx = torch.tensor([1, 4, 6], dtype=torch.int32, device=DEV)
    for _ in range(10):
        step = make_step(3, 16, 80, 128, 8, torch.bfloat16, DEV, gen)
        y = decode(layer, step, params, idx, "flush")
        yb = update(pool, step, params, idx)
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
        y1 = decode(dense.layer(0), step, params, idx)
        y2 = decode(paged.layer(0), step, params, idx)
        torch.testing.assert_close(y1, y2, rtol=0, atol=0)
    torch.testing.assert_close(dense.layer(0).state, page[:, 1:nheads + 1], rtol=0, atol=0)


@pytest.mark.gpu
@pytest.mark.parametrize("mode,tuning", [
    ("replay", Tuning()), ("replay", Tuning(tail_fraction=1.0, ctas_per_sm=1, stages=2, rows_per_cta=8)),
    ("fused", Tuning(fused_heads_per_cta=2))])
def test_cuda_graph_l_cycle_matches_eager(mode, tuning):
    """Graph replay equals eager bit for bit: the shipped replay plan; one CTA per SM, two stages, 8-row tiles, every
    tile after the first wave claimed at run time; the streaming one-launch replay."""
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
    decode(scratch.layer(0), static[0], params, idx, mode, tuning=tuning)  # warm-up
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s, o in zip(static, outs):
            decode(twin.layer(0), s, params, idx, mode, out=o, tuning=tuning)
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
            y = decode(layer, f, params, idx, mode, tuning=tuning)
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
            decode(layer, one, params, idx[slot_ids.index(s):][:1])
            truth.step([s], one, params)
    steps = 3 * L + 5
    xs = [make_step(len(slot_ids), nheads, head_dim, d_state, ngroups, torch.float32, DEV, gen) for _ in range(steps)]
    check_back_to_back(
        lambda x, out: decode(layer, x, params, idx, out=out),
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
        decode(layer, step, params, idx)
        truth.step([0, 2], step, params)
        if t % 500 == 499:
            for s in (0, 2):
                if int(layer.cursor[s]) == 0:
                    worst = max(worst, rel_err(layer.state[s], truth.states[s]))
    print(f"10k-step worst checkpoint rel err {worst:.2e}")
    assert worst <= 1e-5


@pytest.mark.gpu
@pytest.mark.parametrize("mode,tuning", [
    ("replay", Tuning(tail_fraction=None, ctas_per_sm=1, stages=2, rows_per_cta=8)),
    ("replay", Tuning(tail_fraction=1.0, ctas_per_sm=1, stages=2, rows_per_cta=8)),
    ("fused", Tuning(fused_heads_per_cta=4, stages=3, rows_per_cta=8))])
def test_sanitizer_smoke(mode, tuning):
    """Small mixed batch (flush + non-flush + pad rows), run under compute-sanitizer by build_scripts/gpu_check.sh; one
    CTA per SM with two stages, tiles assigned round-robin or, after the first wave, claimed at run time; the
    streaming one-launch replay (4 heads through 3 stages). Outputs and checkpoints of replay and baseline against
    float64."""
    gen, cache, layer, truth, params = _setup(8, 80, 128, 2, 4, "fp32", torch.float32, slots=4)
    pool = layer.state.clone()
    base_truth = Float64Sequential(pool.float())
    slot_ids = [3, -1, 0]
    idx = torch.tensor(slot_ids, dtype=torch.int32, device=DEV)
    for s in (3, 3, 3):  # slot 3 three steps ahead: its flush falls inside the checked steps
        one = make_step(1, 8, 80, 128, 2, torch.float32, DEV, gen)
        decode(layer, one, params, idx[:1], mode, tuning=tuning)
        truth.step([s], one, params)
    for _ in range(5):
        step = make_step(3, 8, 80, 128, 2, torch.float32, DEV, gen)
        out, out_base = (torch.full_like(step["x"], float("nan")) for _ in range(2))
        decode(layer, step, params, idx, mode, out=out, tuning=tuning)
        update(pool, step, params, idx, out_base, tuning)
        assert_rows_written(out, slot_ids)
        assert_rows_written(out_base, slot_ids)
        assert rel_err(out[[0, 2]], truth.step(slot_ids, step, params)[[0, 2]]) <= 1e-5
        assert rel_err(out_base[[0, 2]], base_truth.step(slot_ids, step, params)[[0, 2]]) <= 1e-5
    torch.cuda.synchronize()
    assert layer.cursor[3].item() == (3 + 5) % 4 and layer.cursor[0].item() == 5 % 4
    assert rel_err(pool[[3, 0]], base_truth.states[[3, 0]]) <= 1e-5
