"""Mamba-2 speculative decoding against the float64 sequential recurrence of exactly the accepted tokens: the replay
verify (folds inside the verify, rotating ring origin) with the device commit, and the per-draft-state baseline (CUDA
kernels on a GPU, the CPU reference ops without one); CUDA-graph replay needs a GPU."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kernel_checks import rel_err
from mamba2_helpers import Float64Sequential, make_params
from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.ops import mamba2_spec, spec
from trtllm_replayssm.core.plans import Tuning

pytestmark = pytest.mark.kernels
DEV = "cuda" if torch.cuda.is_available() else "cpu"
SLOTS = 9
SLOT_IDS = [5, -1, 0, 8, 3, 7]  # a pad row between real rows; slots 1, 2, 4, 6 belong to no row
REUSED = 3                      # slot 3 gets a new request half way


def _window(batch: int, T: int, H: int, P: int, N: int, G: int, act: torch.dtype, gen: torch.Generator) -> dict:
    def rnd(*shape, scale=1.0):
        return (torch.randn(*shape, generator=gen) * scale).to(device=DEV, dtype=act)
    return {"x": rnd(batch, T, H, P), "dt": rnd(batch, T, H, scale=1.5), "B": rnd(batch, T, G, N, scale=0.3),
            "C": rnd(batch, T, G, N, scale=0.3), "z": rnd(batch, T, H, P)}


def _token(win: dict, t: int) -> dict:
    return {k: v[:, t] for k, v in win.items()}


def _accepted(batch: int, T: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """Random counts 1..T per row; every window has a row with only the bonus token and one with all drafts."""
    a = torch.randint(1, T + 1, (batch,), generator=gen)
    a[k % batch], a[(k + 2) % batch] = 1, T
    return a.to(torch.int32)


def _setup(H, P, N, G, ring_len, state_dtype, act, seed):
    gen = torch.Generator().manual_seed(seed)
    cache = ReplayStateCache.mamba2(1, SLOTS, H, P, N, G, buffer_len=ring_len, state_dtype=state_dtype,
                                    act_dtype=act, device=DEV)
    layer = cache.layer(0)
    layer.state.copy_(torch.randn(SLOTS, H, P, N, generator=gen).to(DEV) * 0.5)
    params = make_params(H, DEV, gen)
    return gen, cache, layer, params


SHAPES = [(16, 64, 128, 8), (8, 80, 128, 2), (4, 64, 64, 1)]
# The verify kernels a test runs by tuning: at the tests' small batches the grid kernel after the prep kernel, its
# one-launch form, and (threshold 0) the persistent kernel after the prep kernel.
KERNELS = {"grid": replace(mamba2_spec.VERIFY_TUNING, one_launch_verify_max_work_per_sm=0),
           "one_launch": replace(mamba2_spec.VERIFY_TUNING, one_launch_verify_max_work_per_sm=float("inf")),
           "persistent": replace(mamba2_spec.VERIFY_TUNING, adaptive_threshold=0)}
# The CPU reference ops (no GPU) run the contract on the smallest shape, with fewer windows.
CASE_SHAPES = SHAPES if DEV == "cuda" else SHAPES[2:]
WINDOWS = 48 if DEV == "cuda" else 16


@pytest.mark.parametrize("H,P,N,G", CASE_SHAPES)
@pytest.mark.parametrize("T,L", [(1, 16), (2, 16), (4, 16), (8, 16), (4, 5)])
@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
@pytest.mark.parametrize("kernel", list(KERNELS) if DEV == "cuda" else ["reference"])
def test_verify_and_commit_equal_sequential_decode_of_the_accepted_tokens(H, P, N, G, T, L, state_dtype, kernel):
    """Rings of L + T records (as `build --spec-tokens` sizes them; at least 2T); many windows with random
    accepted counts per row, folds at different windows per row, a pad row with poisoned outputs, slot reuse, and
    slots of no row left untouched; on a GPU with each verify kernel (KERNELS), on a CPU the reference ops."""
    _check_verify_and_commit(H, P, N, G, T, L, state_dtype, KERNELS.get(kernel, mamba2_spec.VERIFY_TUNING))


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="row tiles are a CUDA launch choice")
@pytest.mark.parametrize("H,P,N,G", SHAPES[:2])
@pytest.mark.parametrize("T", [2, 4, 8])
@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
def test_verify_with_whole_head_tiles(H, P, N, G, T, state_dtype):
    """The persistent kernel with the row tile the planner takes at serving batch (a whole head per tile), forced at
    the test's batch."""
    tuning = Tuning(rows_per_cta=P, ctas_per_sm=2, stages=2, adaptive_threshold=0)
    plan = mamba2_spec.verify_plan(_setup(H, P, N, G, 16 + T - 1, state_dtype, torch.bfloat16, 0)[2], len(SLOT_IDS),
                                   T, tuning)
    assert (plan.mode, plan.rows_per_cta) == ("replay", P)
    _check_verify_and_commit(H, P, N, G, T, 16, state_dtype, tuning)


@pytest.mark.skipif(DEV != "cuda", reason="row tiles are a CUDA launch choice")
@pytest.mark.parametrize("H,P,N,G,tile", [(*SHAPES[0], 16), (*SHAPES[0], 32), (*SHAPES[1], 16), (*SHAPES[1], 20)])
@pytest.mark.parametrize("T", [2, 4])
def test_one_launch_verify_with_its_serving_tiles(H, P, N, G, tile, T):
    """The one-launch kernel on the row tiles its planner takes at batch 1-4 (Super: 16 and 32 rows, Nano: 16 and
    20), forced at the test's batch."""
    tuning = replace(KERNELS["one_launch"], rows_per_cta=tile)
    plan = mamba2_spec.verify_plan(_setup(H, P, N, G, 16 + T - 1, "fp32", torch.bfloat16, 0)[2], len(SLOT_IDS),
                                   T, tuning)
    assert (plan.mode, plan.prep_threads, plan.rows_per_cta) == ("grid", 0, tile)
    _check_verify_and_commit(H, P, N, G, T, 16, "fp32", tuning)


def _check_verify_and_commit(H, P, N, G, T, L, state_dtype, tuning: Tuning) -> None:
    act = torch.bfloat16
    ring_len = spec_cursor.ring_len(L, T)
    gen, cache, layer, params = _setup(H, P, N, G, ring_len, state_dtype, act, seed=T * 31 + L)
    truth = Float64Sequential(layer.state.float())
    idx = torch.tensor(SLOT_IDS, dtype=torch.int32, device=DEV)
    rows = [b for b, s in enumerate(SLOT_IDS) if s >= 0]
    others = [s for s in range(SLOTS) if s not in SLOT_IDS]
    untouched = {k: v[others].clone() for k, v in layer.slot_tensors().items()}
    worst, folds = 0.0, 0
    for k in range(WINDOWS if T < 8 else WINDOWS // 2):
        if k == WINDOWS // 3:  # slot reuse: a new request's prefill state and an empty history
            fresh = torch.randn(1, H, P, N, generator=gen).to(DEV) * 0.5
            cache.load_prefill_state(0, [REUSED], fresh)
            truth.states[REUSED] = layer.state[REUSED].double()
        win = _window(len(SLOT_IDS), T, H, P, N, G, act, gen)
        before = truth.states.clone()
        out = torch.full_like(win["x"], float("nan"))
        mamba2_spec.verify_decode(layer, win["x"], win["dt"], params.A, win["B"], win["C"], params.D, win["z"],
                                  params.dt_bias, state_batch_indices=idx, out=out, tuning=tuning)
        assert (out[1] == 0).all(), "pad row output is not zeros"
        assert not torch.isnan(out[rows]).any(), "a real row's output is not fully written"
        for b in rows:  # a verify that folded: the checkpoint is the state before the window
            if spec_cursor.unpack(int(layer.cursor[SLOT_IDS[b]]))[1] == 0:
                folds += 1
                tol = 2e-5 if state_dtype == "fp32" else 1e-2
                assert rel_err(layer.state[SLOT_IDS[b]], before[SLOT_IDS[b]]) < tol
        accepted = _accepted(len(SLOT_IDS), T, k, gen)
        for t in range(T):  # float64: every row's accepted tokens, one at a time
            live = [s if s >= 0 and t < int(accepted[b]) else -1 for b, s in enumerate(SLOT_IDS)]
            y = truth.step(live, _token(win, t), params)
            for b in rows:
                if t < int(accepted[b]):
                    worst = max(worst, rel_err(out[b, t], y[b]))
        spec.commit(layer, accepted.to(DEV), idx, window=T)
        for b in rows:
            assert spec_cursor.valid(int(layer.cursor[SLOT_IDS[b]]), T, ring_len)
    assert folds > 0
    assert worst < (1e-2 if state_dtype == "fp32" else 3e-2), worst  # bf16 outputs and (bf16) checkpoint rounding
    for name, before in untouched.items():
        assert torch.equal(layer.slot_tensors()[name][others], before), name


@pytest.mark.parametrize("H,P,N,G", SHAPES[:2] if DEV == "cuda" else SHAPES[2:])
@pytest.mark.parametrize("T", [1, 4, 8])
@pytest.mark.parametrize("state_dtype", ["fp32", "bf16"])
def test_per_draft_verify_and_commit_equal_sequential_decode(H, P, N, G, T, state_dtype):
    act = torch.bfloat16
    gen, cache, layer, params = _setup(H, P, N, G, 16, state_dtype, act, seed=T)
    truth = Float64Sequential(layer.state.float())
    idx = torch.tensor(SLOT_IDS, dtype=torch.int32, device=DEV)
    rows = [b for b, s in enumerate(SLOT_IDS) if s >= 0]
    others = [s for s in range(SLOTS) if s not in SLOT_IDS]
    untouched = layer.state[others].clone()
    inter = torch.empty(len(SLOT_IDS), T, H, P, N, dtype=layer.state.dtype, device=DEV)
    worst = 0.0
    for k in range(12):
        win = _window(len(SLOT_IDS), T, H, P, N, G, act, gen)
        out = torch.full_like(win["x"], float("nan"))
        mamba2_spec.per_draft_verify(layer.state, inter, win["x"], win["dt"], params.A, win["B"], win["C"], params.D,
                                     win["z"], params.dt_bias, state_batch_indices=idx, out=out)
        assert (out[1] == 0).all() and not torch.isnan(out[rows]).any()
        accepted = _accepted(len(SLOT_IDS), T, k, gen)
        for t in range(T):
            live = [s if s >= 0 and t < int(accepted[b]) else -1 for b, s in enumerate(SLOT_IDS)]
            y = truth.step(live, _token(win, t), params)
            for b in rows:
                if t < int(accepted[b]):
                    worst = max(worst, rel_err(out[b, t], y[b]))
        mamba2_spec.per_draft_commit(layer.state, inter, accepted.to(DEV), idx)
        for b in rows:
            tol = 2e-5 if state_dtype == "fp32" else 1e-2
            assert rel_err(layer.state[SLOT_IDS[b]], truth.states[SLOT_IDS[b]]) < tol * (k + 1)
    assert worst < (1e-2 if state_dtype == "fp32" else 3e-2), worst
    assert torch.equal(layer.state[others], untouched)


@pytest.mark.gpu
@pytest.mark.skipif(DEV != "cuda", reason="the persistent kernel's tile claims are a CUDA launch choice")
@pytest.mark.parametrize("T", [2, 4, 8])
def test_persistent_verify_with_claimed_tiles_equals_the_grid_kernel(T):
    """At a batch whose tiles outnumber the persistent kernel's CTAs, half of them claimed at run time, windows with
    random accepted counts (folds included): the persistent kernel's outputs, checkpoints and cursors equal the grid
    kernel's up to float summation order, its rings bit for bit."""
    H, P, N, G, batch, slots = 16, 64, 128, 8, 48, 50
    ring_len = 16 + T - 1
    gen = torch.Generator().manual_seed(3)
    init = torch.randn(slots, H, P, N, generator=gen).to(DEV) * 0.5
    layers = []
    for _ in range(2):
        layer = ReplayStateCache.mamba2(1, slots, H, P, N, G, buffer_len=ring_len, state_dtype="fp32",
                                        act_dtype=torch.bfloat16, device=DEV).layer(0)
        layer.state.copy_(init)
        layers.append(layer)
    params = make_params(H, DEV, gen)
    idx = torch.randperm(slots, generator=gen)[:batch].to(torch.int32).to(DEV)
    grid = replace(mamba2_spec.VERIFY_TUNING, adaptive_threshold=1 << 30)
    persistent = Tuning(ctas_per_sm=1, stages=2, tail_fraction=0.5, adaptive_threshold=0)
    plan = mamba2_spec.verify_plan(layers[1], batch, T, persistent)
    assert plan.mode == "replay" and plan.grid[0] < plan.tail_start < plan.num_tiles, plan
    assert mamba2_spec.verify_plan(layers[0], batch, T, grid).mode == "grid"
    for k in range(3 * ring_len):
        win = _window(batch, T, H, P, N, G, torch.bfloat16, gen)
        acc = _accepted(batch, T, k, gen).to(DEV)
        outs = []
        for layer, tuning in zip(layers, (grid, persistent)):
            out = torch.full_like(win["x"], float("nan"))
            mamba2_spec.verify_decode(layer, win["x"], win["dt"], params.A, win["B"], win["C"], params.D, win["z"],
                                      params.dt_bias, state_batch_indices=idx, out=out, tuning=tuning)
            spec.commit(layer, acc, idx, window=T)
            outs.append(out)
        assert not torch.isnan(outs[1]).any(), k
        assert rel_err(outs[1], outs[0]) < 5e-3, k
        assert torch.equal(layers[1].cursor, layers[0].cursor), k
    assert rel_err(layers[1].state, layers[0].state) < 1e-5
    for name in ("x_ring", "dt_ring", "B_ring"):
        assert torch.equal(getattr(layers[1], name), getattr(layers[0], name)), name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("T", [2, 4])
@pytest.mark.parametrize("kernel", list(KERNELS))
def test_graph_replay_equals_eager(T, kernel):
    """Verify + commit captured once and replayed over many windows (inputs and accepted counts copied into the
    graph's buffers) give the same outputs and state as eager launches, bit for bit, with each verify kernel."""
    tuning = KERNELS[kernel]
    H, P, N, G = 16, 64, 128, 8
    ring_len = 16 + T - 1
    _, _, eager_layer, params = _setup(H, P, N, G, ring_len, "fp32", torch.bfloat16, seed=7)
    _, _, graph_layer, _ = _setup(H, P, N, G, ring_len, "fp32", torch.bfloat16, seed=7)
    gen = torch.Generator().manual_seed(11)
    idx = torch.tensor(SLOT_IDS, dtype=torch.int32, device=DEV)
    static = _window(len(SLOT_IDS), T, H, P, N, G, torch.bfloat16, gen)
    accepted = torch.ones(len(SLOT_IDS), dtype=torch.int32, device=DEV)
    out = torch.empty_like(static["x"])

    def step(layer, win, acc, o):
        mamba2_spec.verify_decode(layer, win["x"], win["dt"], params.A, win["B"], win["C"], params.D, win["z"],
                                  params.dt_bias, state_batch_indices=idx, out=o, tuning=tuning)
        spec.commit(layer, acc, idx, window=T)

    warm = {k: v.clone() for k, v in graph_layer.tensors().items() if v is not None}
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step(graph_layer, static, accepted, out)  # loads the kernels
    torch.cuda.current_stream().wait_stream(side)
    for k, v in warm.items():
        graph_layer.tensors()[k].copy_(v)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step(graph_layer, static, accepted, out)
    for k in range(40):
        win = _window(len(SLOT_IDS), T, H, P, N, G, torch.bfloat16, gen)
        acc = _accepted(len(SLOT_IDS), T, k, gen).to(DEV)
        eager_out = torch.empty_like(win["x"])
        step(eager_layer, win, acc, eager_out)
        for name, v in win.items():
            static[name].copy_(v)
        accepted.copy_(acc)
        graph.replay()
        assert torch.equal(out, eager_out), k
    assert torch.equal(graph_layer.state, eager_layer.state)
    assert torch.equal(graph_layer.cursor, eager_layer.cursor)


def test_argument_errors():
    cache = ReplayStateCache.mamba2(1, 4, 4, 8, 32, 2, buffer_len=5, device="cpu")
    layer = cache.layer(0)
    gen = torch.Generator().manual_seed(0)
    win = _window(2, 3, 4, 8, 32, 2, torch.float32, gen)
    win = {k: v.cpu() for k, v in win.items()}
    A = -torch.ones(4)
    with pytest.raises(ValueError, match=r"^window: 3 tokens need rings of at least 6 records"):
        mamba2_spec.verify_decode(layer, win["x"], win["dt"], A, win["B"], win["C"])
    with pytest.raises(ValueError, match=r"^B: expected shape \[2, 2, \*, 32\]"):
        mamba2_spec.verify_decode(layer, win["x"][:, :2], win["dt"][:, :2], A, win["B"], win["C"][:, :2])
    with pytest.raises(ValueError, match=r"^window: expected 1..8 tokens per verify"):
        spec.commit(layer, torch.ones(2, dtype=torch.int32), window=9)
    with pytest.raises(TypeError, match=r"^accepted: expected dtype"):
        spec.commit(layer, torch.ones(2), window=2)
    with pytest.raises(ValueError, match=r"^inter: expected shape \[2, 3, 4, 8, 32\]"):
        mamba2_spec.per_draft_verify(layer.state, torch.empty(2, 2, 4, 8, 32), win["x"], win["dt"], A, win["B"],
                                     win["C"])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="10,000 windows need a GPU")
def test_ten_thousand_windows_stay_bounded():
    """fp32 checkpoints over 10,000 windows of T = 4 with random accepted counts: every checkpoint a fold writes stays
    within 1e-4 of the float64 state before its window, and no output drifts."""
    H, P, N, G, T = 4, 64, 64, 1, 4
    ring_len = 16 + T - 1
    gen, cache, layer, params = _setup(H, P, N, G, ring_len, "fp32", torch.float32, seed=5)
    truth = Float64Sequential(layer.state.float())
    slot_ids = [1, 4, 7]
    idx = torch.tensor(slot_ids, dtype=torch.int32, device=DEV)
    worst_state = worst_out = 0.0
    for k in range(10_000):
        win = _window(len(slot_ids), T, H, P, N, G, torch.float32, gen)
        before = truth.states[slot_ids].clone()
        out = mamba2_spec.verify_decode(layer, win["x"], win["dt"], params.A, win["B"], win["C"], params.D, win["z"],
                                        params.dt_bias, state_batch_indices=idx)
        accepted = _accepted(len(slot_ids), T, k, gen)
        for t in range(T):
            live = [s if t < int(accepted[b]) else -1 for b, s in enumerate(slot_ids)]
            y = truth.step(live, _token(win, t), params)
            for b in range(len(slot_ids)):
                if t < int(accepted[b]):
                    worst_out = max(worst_out, rel_err(out[b, t], y[b]))
        for b, s in enumerate(slot_ids):
            if spec_cursor.unpack(int(layer.cursor[s]))[1] == 0 and k > 0:
                worst_state = max(worst_state, rel_err(layer.state[s], before[b]))
        spec.commit(layer, accepted.to(DEV), idx, window=T)
    assert worst_state < 1e-4 and worst_out < 1e-4, (worst_state, worst_out)
