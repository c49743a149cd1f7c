"""GDN and KDA speculative decoding against a float64 sequential reference on random inputs: the replay verify
(``verify_decode``: folds inside the verify, rotating ring origin) with the family-agnostic commit (``spec.commit``),
and the per-draft-state baseline (``per_draft_verify_decode`` / ``per_draft_commit``). Every window token's output,
checkpoints after the verifies' folds, cursor words, staggered rows, wrap-around of the origin, slot reuse, a pad row
with poisoned outputs, slots no row owns left bit for bit (CUDA kernels on a GPU, the CPU reference ops without one);
CUDA-graph replay equal to eager needs a GPU."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from kernel_checks import rel_err
from test_gdn_kda_gpu import DEV, RING_NAMES, Problem, assert_same_bits, make_problem, snapshot

from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.ops import delta, spec

pytestmark = pytest.mark.kernels
PAD = -1
SLOT_IDS = [5, PAD, 0, 8, 3]  # row 1 pads
FOREIGN = [1, 2, 4, 6, 7]     # slots no row owns
REUSED = 0                    # slot 0 gets a new request part way
# The CPU reference ops (no GPU) run the contract on smaller heads (KDA: V = K).
KEY_DIM, VALUE_DIM = (128, 128) if DEV == "cuda" else (64, 32)


def problem(family: str, seed: int, key_dim: int = KEY_DIM, value_heads: int = 4) -> Problem:
    """GDN: 2 key heads of ``value_heads`` / 2 value heads each; KDA: 2 heads."""
    if family == "gdn":
        return make_problem(family, 2, value_heads, key_dim, VALUE_DIM, seed=seed)
    return make_problem(family, 2, 2, KEY_DIM, KEY_DIM, seed=seed)


def draw_window(prob: Problem, batch: int, T: int, gen: torch.Generator, act: torch.dtype) -> dict[str, torch.Tensor]:
    """Per-token inputs [b, T, ...] (T independent draws of the problem's step inputs)."""
    steps = [prob.draw(batch, gen, act) for _ in range(T)]
    return {key: torch.stack([s[key] for s in steps], dim=1) for key in steps[0]}


def token(x: dict[str, torch.Tensor], t: int) -> dict[str, torch.Tensor]:
    return {key: val[:, t] for key, val in x.items()}


# The verify kernels (CUDA): the grid kernel (its planned row tile, then 32 and 128 rows: a row per lane), and the
# prep + persistent kernels forced at every batch.
KERNELS = {"grid": delta.VERIFY_TUNING, "grid_32_rows": replace(delta.VERIFY_TUNING, rows_per_cta=32),
           "grid_128_rows": replace(delta.VERIFY_TUNING, rows_per_cta=128),
           "persistent": replace(delta.VERIFY_TUNING, adaptive_threshold=0)}
KERNEL_NAMES = list(KERNELS) if DEV == "cuda" else ["grid"]


def verify(prob: Problem, layer, x: dict[str, torch.Tensor], idx: torch.Tensor, out: torch.Tensor,
           kernel: str = "grid") -> torch.Tensor:
    return prob.ops.verify_decode(layer, **prob.args(x), state_batch_indices=idx, pad_slot_id=PAD, out=out,
                                  tuning=KERNELS[kernel])


def commit(layer, accepted: list[int] | torch.Tensor, idx: torch.Tensor, T: int) -> None:
    spec.commit(layer, torch.as_tensor(accepted, dtype=torch.int32).to(DEV), idx, PAD, window=T)


def per_draft(prob: Problem, state, inter, x: dict[str, torch.Tensor], idx: torch.Tensor,
              out: torch.Tensor) -> torch.Tensor:
    return prob.ops.per_draft_verify_decode(state, inter, **prob.args(x), state_batch_indices=idx, pad_slot_id=PAD,
                                            out=out)


def new_layer(prob: Problem, L: int, state_dtype: str, act: torch.dtype, gen: torch.Generator, slots: int = 9):
    """A cache with a random checkpoint and NaN rings (stale records no kernel may read), and its layer."""
    cache = prob.new_cache(slots, L, state_dtype, act)
    layer = cache.layer(0)
    layer.state.copy_(0.3 * torch.randn(layer.state.shape, generator=gen))
    for name in RING_NAMES:
        getattr(layer, name).fill_(float("nan"))
    return cache, layer


class Truth:
    """Float64 state per slot; ``window`` gives every window token's output from the committed state and advances
    by the accepted tokens only."""

    def __init__(self, prob: Problem, states: torch.Tensor) -> None:
        self.prob, self.states = prob, states.to(torch.float64).clone()

    def window(self, x: dict[str, torch.Tensor], accepted: list[int]) -> torch.Tensor:
        """Outputs [b, T, HV, V] of every token (zeros for pad rows); slots move on by ``accepted[b]`` tokens."""
        T = x["q"].shape[1]
        outs = torch.zeros(x["v"].shape, dtype=torch.float64, device=DEV)
        for r, s in enumerate(SLOT_IDS):
            if s == PAD:
                continue
            state = self.states[s:s + 1]
            for t in range(T):
                y, state = self.prob.sequential(state, token(x, t), [r])
                outs[r, t] = y[0]
                if t + 1 == accepted[r]:
                    self.states[s] = state[0]
        return outs


def stagger(prob: Problem, layer, truth: Truth, idx: torch.Tensor, T: int, act: torch.dtype,
            gen: torch.Generator, kernel: str = "grid") -> None:
    """Row r first runs r windows alone, each committing one token: staggered cursors."""
    for r, s in enumerate(SLOT_IDS):
        for _ in range(r if s != PAD else 0):
            x = draw_window(prob, 1, T, gen, act)
            out = torch.empty(1, T, prob.HV, prob.V, dtype=act, device=DEV)
            verify(prob, layer, x, idx[r:r + 1], out, kernel)
            commit(layer, [1], idx[r:r + 1], T)
            _, state = prob.sequential(truth.states[s:s + 1], token(x, 0), [0])
            truth.states[s] = state[0]


def check_verify_cursors(layer, before: torch.Tensor, T: int, ring_len: int) -> list[int]:
    """Each row's cursor word after a verify: unchanged, or (a fold) past the history with count 0, exactly when
    ``spec_cursor.folds_before``; returns the rows that folded."""
    folded = []
    for r, s in enumerate(SLOT_IDS):
        if s == PAD:
            continue
        origin, count = spec_cursor.unpack(int(before[s]))
        fold = spec_cursor.folds_before(count, T, ring_len)
        expected = spec_cursor.pack((origin + count) % ring_len, 0) if fold else int(before[s])
        assert int(layer.cursor[s]) == expected, f"slot {s}: cursor word after the verify"
        if fold:
            folded.append(r)
    return folded


# (8, 24): rings of 32 records (L + T), the longest the kernels take
CASES = [(1, 8, "fp32", torch.float32, 1e-5), (2, 8, "fp32", torch.float32, 1e-5),
         (4, 16, "fp32", torch.float32, 1e-5), (8, 16, "fp32", torch.float32, 1e-5), (8, 24, "fp32", torch.float32, 1e-5),
         (3, 8, "fp32", torch.bfloat16, 2e-2), (4, 16, "bf16", torch.bfloat16, 3e-2),
         (4, 16, "fp16", torch.float16, 1e-2), (4, 5, "fp32", torch.float32, 1e-5)]


@pytest.mark.parametrize("kernel", KERNEL_NAMES)
@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("T,L,state_dtype,act,tol", CASES if DEV == "cuda" else [CASES[i] for i in (1, 5, 6, 8)])
def test_verify_and_commit_match_float64(family, T, L, state_dtype, act, tol, kernel, key_dim=KEY_DIM,
                                         value_heads=4):
    """Rings of L + T records (as `build --spec-tokens` sizes them; at least 2T); many windows with random
    accepted counts per row (all drafts / only the bonus token in every window), folds at different windows per row,
    the origin wrapping around the ring, slot reuse."""
    ring_len = spec_cursor.ring_len(L, T)
    prob = problem(family, seed=T * 100 + L, key_dim=key_dim, value_heads=value_heads)
    gen = torch.Generator().manual_seed(T * 7 + L)
    cache, layer = new_layer(prob, ring_len, state_dtype, act, gen)
    truth = Truth(prob, layer.state.float())
    idx = torch.tensor(SLOT_IDS, dtype=torch.int32, device=DEV)
    rows = [r for r, s in enumerate(SLOT_IDS) if s != PAD]
    stagger(prob, layer, truth, idx, T, act, gen, kernel)
    frozen = snapshot(layer, FOREIGN)
    worst_out = worst_state = 0.0
    folds, wraps = 0, 0
    windows = 4 * ring_len // T + 4
    for k in range(windows):
        if k == windows // 2:  # slot reuse: a new request's prefill state and an empty history
            fresh = 0.3 * torch.randn(1, *layer.state.shape[1:], generator=gen)
            cache.load_prefill_state(0, [REUSED], fresh.to(DEV))
            truth.states[REUSED] = layer.state[REUSED].double()
        x = draw_window(prob, len(SLOT_IDS), T, gen, act)
        out = torch.full_like(x["v"], float("nan"))
        before, states_before = layer.cursor.clone(), truth.states.clone()
        verify(prob, layer, x, idx, out, kernel)
        for r in check_verify_cursors(layer, before, T, ring_len):
            folds += 1
            s = SLOT_IDS[r]
            worst_state = max(worst_state, rel_err(layer.state[s], states_before[s]))
        accepted = torch.randint(1, T + 1, (len(SLOT_IDS),), generator=gen).tolist()
        accepted[0], accepted[2] = T, 1  # all drafts / only the bonus token, every window
        expected = truth.window(x, accepted)
        assert (out[1] == 0).all(), "pad row output is not zeros"
        assert not torch.isnan(out[rows]).any(), "output row not fully written"
        worst_out = max(worst_out, rel_err(out[rows], expected[rows]))
        words = layer.cursor.clone()
        commit(layer, accepted, idx, T)
        for r in rows:
            origin, count = spec_cursor.unpack(int(words[SLOT_IDS[r]]))
            assert int(layer.cursor[SLOT_IDS[r]]) == spec_cursor.pack(origin, count + accepted[r])
            wraps += origin + count + accepted[r] > ring_len
    print(f"{family} {kernel} T{T} L{ring_len} {state_dtype}/{act}: out {worst_out:.2e} state {worst_state:.2e} "
          f"({folds} folds, {wraps} wraps)")
    assert folds >= 3 and wraps >= 1
    assert worst_out <= tol and worst_state <= tol
    assert_same_bits(frozen, snapshot(layer, FOREIGN))
    assert int(layer.arrive.abs().sum()) == 0


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", [k for k in KERNELS if k != "grid_128_rows"])
def test_verify_with_256_key_channels(kernel):
    """GDN with 256 key channels (8 per lane; the persistent kernel runs one CTA per SM; no 128-row tile, whose
    checkpoint rows would not fit a thread's registers): the contract above."""
    test_verify_and_commit_match_float64("gdn", 4, 16, "fp32", torch.float32, 1e-5, kernel, key_dim=256)


@pytest.mark.gpu
@pytest.mark.parametrize("T,L", [(4, 16), (2, 5), (8, 16)])
def test_verify_with_16_value_heads_per_key_head(T, L):
    """GDN with 16 value heads per key head (the most a persistent verify prep CTA shares its key dots among): the
    contract above for the persistent kernels."""
    test_verify_and_commit_match_float64("gdn", T, L, "fp32", torch.float32, 1e-5, "persistent", value_heads=32)


@pytest.mark.parametrize("family", ["gdn", "kda"])
@pytest.mark.parametrize("state_dtype,act,tol", [("fp32", torch.float32, 1e-5), ("bf16", torch.bfloat16, 3e-2)])
def test_per_draft_baseline_matches_float64_and_the_replay_verify(family, state_dtype, act, tol):
    """Per-draft verify: every token's output and draft state against float64; the commit copies exactly the
    accepted draft; the replay verify from the same checkpoint (empty rings) gives the same outputs."""
    T, L = 4, 8
    prob = problem(family, seed=51)
    gen = torch.Generator().manual_seed(52)
    _, layer = new_layer(prob, L, state_dtype, act, gen)
    pool = layer.state.clone()
    frozen = pool[FOREIGN].clone()
    truth = Truth(prob, pool.float())
    idx = torch.tensor(SLOT_IDS, dtype=torch.int32, device=DEV)
    rows = [r for r, s in enumerate(SLOT_IDS) if s != PAD]
    for _ in range(3):
        x = draw_window(prob, len(SLOT_IDS), T, gen, act)
        inter = torch.full((len(SLOT_IDS), T, prob.HV, prob.V, prob.K), float("nan"), dtype=pool.dtype, device=DEV)
        out, out_replay = (torch.full_like(x["v"], float("nan")) for _ in range(2))
        layer.state.copy_(pool)
        layer.cursor.zero_()
        before = pool.clone()
        per_draft(prob, pool, inter, x, idx, out)
        verify(prob, layer, x, idx, out_replay)
        assert torch.equal(pool, before), "per-draft verify wrote the state"
        accepted = [T, 2, 3, 1, 4]
        drafts = Truth(prob, pool.float())
        expected = truth.window(x, accepted)
        assert (out[1] == 0).all() and not torch.isnan(out[rows]).any()
        assert rel_err(out[rows], expected[rows]) <= tol
        assert rel_err(out_replay[rows], out[rows]) <= tol
        for t in range(T):  # the draft states: the float64 state after token t
            drafts.window(x, [t + 1] * len(SLOT_IDS))
            for r in rows:
                assert rel_err(inter[r, t], drafts.states[SLOT_IDS[r]]) <= tol, f"row {r} draft {t}"
            drafts.states = before.to(torch.float64).clone()
        delta.per_draft_commit(pool, inter, torch.tensor(accepted, dtype=torch.int32, device=DEV), idx, PAD)
        for r in rows:
            assert torch.equal(pool[SLOT_IDS[r]], inter[r, accepted[r] - 1])
    assert torch.equal(pool[FOREIGN], frozen)


@pytest.mark.gpu
@pytest.mark.parametrize("kernel", list(KERNELS))
@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_cuda_graph_replay_equals_eager(family, kernel):
    """Verify + commit windows captured in one CUDA graph (accepted counts a device tensor) equal eager bit for bit,
    folds included."""
    T, L, windows = 3, 8, 5
    prob = problem(family, seed=61)
    gen = torch.Generator().manual_seed(62)
    act = torch.bfloat16
    _, layer = new_layer(prob, L, "fp32", act, gen)
    idx = torch.tensor(SLOT_IDS, dtype=torch.int32, device=DEV)
    stagger(prob, layer, Truth(prob, layer.state.float()), idx, T, act, gen, kernel)
    twin = prob.new_cache(9, L, "fp32", act).layer(0)
    static = [draw_window(prob, len(SLOT_IDS), T, gen, act) for _ in range(windows)]
    accepted = [torch.ones(len(SLOT_IDS), dtype=torch.int32, device=DEV) for _ in range(windows)]
    outs = [torch.empty_like(s["v"]) for s in static]
    verify(prob, twin, static[0], idx, outs[0], kernel)  # warm-up (load)
    spec.commit(twin, accepted[0], idx, PAD, window=T)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for s, a, o in zip(static, accepted, outs):
            verify(prob, twin, s, idx, o, kernel)
            spec.commit(twin, a, idx, PAD, window=T)
    for name, t in layer.tensors().items():
        getattr(twin, name).copy_(t)
    for _ in range(2):
        for s, a in zip(static, accepted):
            for key, val in draw_window(prob, len(SLOT_IDS), T, gen, act).items():
                s[key].copy_(val)
            a.copy_(torch.randint(1, T + 1, (len(SLOT_IDS),), generator=gen, dtype=torch.int32))
        graph.replay()
        for s, a, o in zip(static, accepted, outs):
            y = verify(prob, layer, s, idx, torch.empty_like(o), kernel)
            spec.commit(layer, a, idx, PAD, window=T)
            torch.testing.assert_close(o, y, rtol=0, atol=0)
        for name, t in layer.tensors().items():
            torch.testing.assert_close(getattr(twin, name), t, rtol=0, atol=0, equal_nan=True)
