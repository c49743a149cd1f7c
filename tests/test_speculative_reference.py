"""Speculative decoding from checkpoint + ring, the float32 references (``verify_step_`` / ``commit_`` of
``core/reference/mamba2.py``, ``gdn.py``, ``kda.py``): every accepted token's output equals sequential float64 decode of
exactly the accepted tokens, over many windows with random per-row acceptance (only the bonus token, all drafts,
mixed), early flushes, a pad row and (Mamba-2) slot reuse; the checkpoint after a commit's flush equals the sequential
state."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.families import get_family
from trtllm_replayssm.core.reference import gdn as ref_gdn, kda as ref_kda, mamba2 as ref

DIMS = Mamba2Dims(nheads=4, head_dim=8, d_state=16, n_groups=2)
PAD = -1
SHAPE = (DIMS.nheads, DIMS.head_dim, DIMS.d_state)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30))


def _window(batch: int, T: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    H, P, N, G = DIMS.nheads, DIMS.head_dim, DIMS.d_state, DIMS.n_groups
    return {"x": torch.randn(batch, T, H, P, generator=gen).bfloat16(),
            "dt": 0.5 * torch.randn(batch, T, H, generator=gen),
            "B": (torch.randn(batch, T, G, N, generator=gen) / 4).bfloat16(),
            "C": (torch.randn(batch, T, G, N, generator=gen) / 4).bfloat16()}


@pytest.mark.parametrize("T,L,state", [(1, 8, "fp32"), (2, 8, "fp32"), (4, 8, "fp32"), (4, 16, "fp32"),
                                       (8, 16, "fp32"), (4, 8, "bf16")])
def test_verify_and_commit_equal_sequential_decode_of_the_accepted_tokens(T, L, state):
    gen = torch.Generator().manual_seed(T * 100 + L)
    H = DIMS.nheads
    cache = get_family("mamba2").new_cache(DIMS, 1, 7, buffer_len=L, state_dtype=state, device="cpu")
    layer = cache.layer(0)
    idx = torch.tensor([5, 2, PAD, 0, 6], dtype=torch.int32)  # row 2 pads
    rows = [0, 1, 3, 4]
    A = -torch.empty(H).uniform_(0.5, 4.0, generator=gen)
    D = torch.randn(H, generator=gen)
    dt_bias = torch.log(torch.expm1(torch.empty(H).uniform_(0.01, 0.2, generator=gen)))
    start = torch.randn(len(rows), *SHAPE, generator=gen) * 0.3
    cache.load_prefill_state(0, idx[rows], start)
    seq = layer.checkpoint().fold_values(idx[rows].long()).double()  # the prefill state as stored
    untouched = {k: v.clone() for k, v in layer.tensors().items()}
    worst = 0.0
    for k in range(40):
        if k == 23:  # slot reuse: row 3's slot gets a new request (prefill hand-off: new checkpoint, cursor 0)
            fresh = torch.randn(1, *SHAPE, generator=gen) * 0.3
            cache.load_prefill_state(0, idx[[3]], fresh)
            seq[2] = layer.checkpoint().fold_values(idx[[3]].long())[0].double()
        inp = _window(len(idx), T, gen)
        out = torch.full((len(idx), T, H, DIMS.head_dim), float("nan"), dtype=torch.bfloat16)
        before = seq.clone()
        ref.verify_step_(layer.checkpoint(), layer.x_ring, layer.dt_ring, layer.B_ring, layer.cursor, inp["x"],
                         inp["dt"], A, inp["B"], inp["C"], D, None, dt_bias, True, idx, PAD, out)
        assert (out[2] == 0).all()
        accepted = torch.randint(1, T + 1, (len(idx),), generator=gen)
        accepted[0], accepted[1] = T, 1  # all drafts / only the bonus token, every window
        for i, b in enumerate(rows):
            for t in range(int(accepted[b])):
                seq_new, y = ref.sequential_step(seq[i:i + 1], inp["x"][b:b + 1, t], inp["dt"][b:b + 1, t], A,
                                                 inp["B"][b:b + 1, t], inp["C"][b:b + 1, t], D, dt_bias=dt_bias)
                seq[i] = seq_new[0]
                worst = max(worst, _rel(out[b, t].float(), y[0]))
        folded = [spec_cursor.unpack(int(layer.cursor[idx[b]]))[1] == 0 for b in rows]
        for i, b in enumerate(rows):  # a verify that folded: the checkpoint is the state before its window
            if folded[i]:
                tol = 1e-5 if state == "fp32" else 1e-2
                assert _rel(layer.checkpoint().fold_values(idx[[b]].long())[0], before[i]) < tol
        spec_cursor.commit_(layer.cursor, accepted, idx, PAD, window=T)
        for b in rows:
            assert spec_cursor.valid(int(layer.cursor[idx[b]]), T, L)  # the next window fits
    assert worst < 5e-3  # bf16 outputs: their own rounding (2^-9 per element)
    for name in ("x_ring", "dt_ring", "B_ring", "cursor", "state"):  # slots 1, 3, 4 belong to no row
        assert torch.equal(layer.tensors()[name][[1, 3, 4]], untouched[name][[1, 3, 4]]), name


def test_verify_folds_exactly_when_the_history_and_two_windows_overrun_the_ring():
    gen = torch.Generator().manual_seed(1)
    cache = get_family("mamba2").new_cache(DIMS, 1, 2, buffer_len=8, device="cpu")
    layer = cache.layer(0)
    idx = torch.tensor([1], dtype=torch.int32)
    A = -torch.ones(DIMS.nheads)
    words = []
    for a in (2, 1, 2, 3, 1):  # T = 3, R = 8: a verify folds from count 3 on (3 + 6 > 8)
        inp = _window(1, 3, gen)
        out = torch.empty(1, 3, DIMS.nheads, DIMS.head_dim, dtype=torch.bfloat16)
        ref.verify_step_(layer.checkpoint(), layer.x_ring, layer.dt_ring, layer.B_ring, layer.cursor, inp["x"],
                         inp["dt"], A, inp["B"], inp["C"], None, None, None, True, idx, PAD, out)
        words.append(spec_cursor.unpack(int(layer.cursor[1])))
        spec_cursor.commit_(layer.cursor, torch.tensor([a]), idx, PAD, window=3)
        words.append(spec_cursor.unpack(int(layer.cursor[1])))
    # (origin, count) after each verify, then after each commit: a fold moves the origin past the history
    assert words == [(0, 0), (0, 2), (0, 2), (0, 3), (3, 0), (3, 2), (3, 2), (3, 5), (0, 0), (0, 1)]  # wraps


def test_verify_and_commit_checks():
    cache = get_family("mamba2").new_cache(DIMS, 1, 2, buffer_len=6, device="cpu")
    layer = cache.layer(0)
    layer.cursor[1] = spec_cursor.pack(1, 4)
    idx = torch.tensor([1], dtype=torch.int32)
    inp = _window(1, 3, torch.Generator().manual_seed(0))
    out = torch.empty(1, 3, DIMS.nheads, DIMS.head_dim, dtype=torch.bfloat16)
    A = -torch.ones(DIMS.nheads)
    with pytest.raises(ValueError, match=r"^cursor: slot 1 holds word 1025 \(origin, count\) = \(1, 4\); a window of 3"):
        ref.verify_step_(layer.checkpoint(), layer.x_ring, layer.dt_ring, layer.B_ring, layer.cursor, inp["x"],
                         inp["dt"], A, inp["B"], inp["C"], None, None, None, True, idx, PAD, out)
    with pytest.raises(ValueError, match=r"^accepted: expected 1..3 per row"):
        spec_cursor.commit_(layer.cursor, torch.tensor([0]), idx, PAD, window=3)


# ------------------------------------------------------------------------------------------------ GDN and KDA
DELTA_DIMS = {"gdn": GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=16, head_v_dim=8),
              "kda": KDADims(num_heads=2, head_dim=16)}


def _delta_window(family: str, batch: int, T: int, gen: torch.Generator) -> dict[str, torch.Tensor]:
    d = DELTA_DIMS[family]
    H, HV, K, V = d.key_heads, d.heads, d.cols, d.rows
    win = {"q": torch.randn(batch, T, H, K, generator=gen).bfloat16(),
           "k": torch.randn(batch, T, H, K, generator=gen).bfloat16(),
           "v": torch.randn(batch, T, HV, V, generator=gen).bfloat16(),
           "b": torch.randn(batch, T, HV, generator=gen)}
    win["a"] = 0.5 * torch.randn(batch, T, HV, K, generator=gen) if family == "kda" else \
        0.5 * torch.randn(batch, T, HV, generator=gen)
    return win


@pytest.mark.parametrize("family,T,L,state", [("gdn", 1, 8, "fp32"), ("gdn", 3, 8, "fp32"), ("gdn", 3, 7, "fp32"),
                                              ("gdn", 8, 16, "fp32"), ("kda", 2, 8, "fp32"), ("kda", 4, 16, "fp32"),
                                              ("kda", 3, 8, "bf16")])
def test_delta_rule_verify_and_commit_equal_sequential_decode(family, T, L, state):
    mod = {"gdn": ref_gdn, "kda": ref_kda}[family]
    d = DELTA_DIMS[family]
    HV = d.heads
    gen = torch.Generator().manual_seed(len(family) * 1000 + T * 10 + L)
    cache = get_family(family).new_cache(d, 1, 6, buffer_len=L, state_dtype=state, device="cpu")
    layer = cache.layer(0)
    idx = torch.tensor([4, PAD, 1, 3], dtype=torch.int32)
    rows = [0, 2, 3]
    A_log = torch.empty(HV).uniform_(-1.0, 0.5, generator=gen)
    dt_bias = torch.randn(HV, d.cols, generator=gen) if family == "kda" else torch.randn(HV, generator=gen)
    cache.load_prefill_state(0, idx[rows], torch.randn(len(rows), HV, d.rows, d.cols, generator=gen) * 0.2)
    seq = layer.checkpoint().fold_values(idx[rows].long()).double()
    untouched = {k: v.clone() for k, v in layer.tensors().items()}
    gates = (None,) if family == "kda" else ()  # KDA takes a lower bound (None: the plain gate) before the scale
    tol = 2e-2 if state == "fp32" else 4e-2  # bf16 u and k rings (docs/algorithm.md, numerics)
    worst, origins = 0.0, set()
    for n in range(30):
        if n == 17:  # slot reuse: row 3's slot gets a new request (prefill hand-off: new checkpoint, cursor 0)
            cache.load_prefill_state(0, idx[[3]], torch.randn(1, HV, d.rows, d.cols, generator=gen) * 0.2)
            seq[2] = layer.checkpoint().fold_values(idx[[3]].long())[0].double()
        win = _delta_window(family, len(idx), T, gen)
        out = torch.full((len(idx), T, HV, d.rows), float("nan"), dtype=torch.bfloat16)
        before = seq.clone()
        mod.verify_step_(layer.checkpoint(), layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor, win["q"],
                         win["k"], win["v"], win["a"], win["b"], A_log, dt_bias, *gates, None, idx, PAD, out)
        assert (out[1] == 0).all()
        for i, b in enumerate(rows):  # a verify that folded: the checkpoint is the state before its window
            origin, count = spec_cursor.unpack(int(layer.cursor[idx[b]]))
            origins.add(origin)
            if count == 0:
                assert _rel(layer.checkpoint().fold_values(idx[[b]].long())[0], before[i]) < tol
        accepted = torch.randint(1, T + 1, (len(idx),), generator=gen)
        accepted[0], accepted[2] = T, 1
        for i, b in enumerate(rows):
            for t in range(int(accepted[b])):
                y, new = mod.sequential_step(seq[i:i + 1], win["q"][b:b + 1, t], win["k"][b:b + 1, t],
                                             win["v"][b:b + 1, t], win["a"][b:b + 1, t], win["b"][b:b + 1, t],
                                             A_log, dt_bias)
                seq[i] = new[0]
                worst = max(worst, _rel(out[b, t].float(), y[0]))
        get_family(family).commit(layer, win, accepted, state_batch_indices=idx, pad_slot_id=PAD, window=T)
        for b in rows:
            assert spec_cursor.valid(int(layer.cursor[idx[b]]), T, L)  # the next window fits
    assert len(origins) > 2  # the origins rotate (and wrap: L is no multiple of every fold's count)
    assert worst < tol
    for name, t in layer.tensors().items():  # slots 0, 2, 5 belong to no row
        assert torch.equal(t[[0, 2, 5]].nan_to_num(), untouched[name][[0, 2, 5]].nan_to_num()), name


def test_delta_rule_verify_checks():
    d = DELTA_DIMS["gdn"]
    cache = get_family("gdn").new_cache(d, 1, 2, buffer_len=6, device="cpu")
    layer = cache.layer(0)
    layer.cursor[1] = spec_cursor.pack(1, 4)
    idx = torch.tensor([1], dtype=torch.int32)
    win = _delta_window("gdn", 1, 3, torch.Generator().manual_seed(0))
    out = torch.empty(1, 3, d.heads, d.rows, dtype=torch.bfloat16)
    args = (torch.zeros(d.heads), torch.zeros(d.heads))
    with pytest.raises(ValueError, match=r"^cursor: slot 1 holds word 1025 \(origin, count\) = \(1, 4\); a window"):
        ref_gdn.verify_step_(layer.checkpoint(), layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor, win["q"],
                             win["k"], win["v"], win["a"], win["b"], *args, None, idx, PAD, out)


# ------------------------------------------------------------------------------------------------ conv window
@pytest.mark.parametrize("T,width", [(1, 4), (3, 4), (8, 4), (4, 2)])
def test_conv_window_equals_sequential_conv_of_the_accepted_tokens(T, width):
    """The causal conv1d of a speculative window (``lab/layers/reference.py``): each token's output equals
    sequential conv steps, and the committed conv state is the sequential one after exactly the accepted tokens."""
    from trtllm_replayssm.core.reference import conv as conv_ref
    from trtllm_replayssm.lab.layers import reference as layers_ref

    gen = torch.Generator().manual_seed(T * 10 + width)
    batch, C = 5, 12
    weight = torch.randn(C, 1, width, generator=gen)
    bias = torch.randn(C, generator=gen)
    state = torch.randn(batch, C, width - 1, generator=gen)
    seq_state = state.clone()
    for _ in range(6):
        x = torch.randn(batch, T, C, generator=gen)
        y = layers_ref.conv1d_verify(x, state, weight, bias, silu=True)
        accepted = torch.randint(1, T + 1, (batch,), generator=gen)
        accepted[0], accepted[1] = T, 1
        for b in range(batch):
            st = seq_state[b:b + 1].clone()
            for t in range(T):  # every window position matches a sequential step (accepted or not)
                assert torch.allclose(conv_ref.conv1d_update_(x[b:b + 1, t], st, weight, bias, True)[0][0], y[b, t],
                                      atol=1e-6)
                if t + 1 == int(accepted[b]):
                    seq_state[b] = st[0]
        layers_ref.conv1d_commit_(state, x, accepted)
        assert torch.equal(state, seq_state)
    with pytest.raises(ValueError, match=r"^accepted: expected 1..3 per row"):
        layers_ref.conv1d_commit_(state, torch.zeros(batch, 3, C), torch.zeros(batch, dtype=torch.long))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_commit_of_every_layer_at_once_equals_a_commit_per_layer(device):
    """spec.commit_layers (one launch for a cache's [layers, slots] cursors) moves each layer's cursors as
    spec.commit of that layer does; pad rows move nothing."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from trtllm_replayssm.core.ops import spec

    gen = torch.Generator().manual_seed(3)
    T, R, layers, slots = 3, 8, 4, 6
    cursor = torch.tensor([[spec_cursor.pack(int(o), int(c)) for o, c in zip(
        torch.randint(0, R, (slots,), generator=gen), torch.randint(0, R - T + 1, (slots,), generator=gen))]
        for _ in range(layers)], dtype=torch.int32, device=device)
    idx = torch.tensor([4, PAD, 0, 2], dtype=torch.int32, device=device)
    accepted = torch.tensor([1, 2, 3, 2], dtype=torch.int32, device=device)
    before, expected = cursor.clone(), cursor.clone()
    for i in range(layers):
        spec.commit(SimpleNamespace(cursor=expected[i], buffer_len=R), accepted, idx, PAD, window=T)
    spec.commit_layers(cursor, R, accepted, idx, PAD, window=T)
    assert torch.equal(cursor, expected)
    committed, untouched = [4, 0, 2], [1, 3, 5]
    assert (cursor[:, committed] != before[:, committed]).all()
    assert torch.equal(cursor[:, untouched], before[:, untouched])


def test_commit_layers_names_a_bad_cursor():
    """commit_layers takes [layers, slots] int32 cursors, contiguous; anything else is refused, naming ``cursor``."""
    from trtllm_replayssm.core.ops import spec

    accepted, idx = torch.ones(2, dtype=torch.int32), torch.tensor([0, 1], dtype=torch.int32)
    with pytest.raises(ValueError, match=r"^cursor: the last 2 dim\(s\) must be contiguous"):
        spec.commit_layers(torch.zeros(4, 3, dtype=torch.int32).t(), 8, accepted, idx, window=2)
    with pytest.raises(ValueError, match=r"^cursor: expected shape \[\*, \*\]"):
        spec.commit_layers(torch.zeros(3, dtype=torch.int32), 8, accepted, idx, window=2)
    with pytest.raises(TypeError, match=r"^cursor: expected dtype"):
        spec.commit_layers(torch.zeros(2, 3, dtype=torch.int64), 8, accepted, idx, window=2)
    with pytest.raises(TypeError, match=r"^cursor: expected a torch.Tensor"):
        spec.commit_layers([[0, 0]], 8, accepted, idx, window=2)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_commit_skips_ids_outside_the_pool_and_repeated_slots(device):
    """The commit takes decode-row ids as serving hands them over (CUDA-graph padding rows repeat a dummy slot, ids
    may be negative or past the pool): on every device a row commits nothing when its slot repeats an earlier row's
    or lies outside [0, slots); the first row of a repeated slot commits."""
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from trtllm_replayssm.core.ops import spec

    T, R, layers, slots = 3, 9, 2, 5
    words = [[spec_cursor.pack(o, c) for o, c in zip([0, 3, 8, 1, 5], [1, 0, 2, 4, 3])] for _ in range(layers)]
    ids = [3, 3, -2, 0, slots, 3, PAD, 0, slots + 7]
    accepted = [2, 1, 3, 3, 1, 2, 1, 1, 2]
    cursor = torch.tensor(words, dtype=torch.int32, device=device)
    spec.commit_layers(cursor, R, torch.tensor(accepted, dtype=torch.int32, device=device),
                       torch.tensor(ids, dtype=torch.int32, device=device), PAD, window=T)
    expected = _kernel_commit_model(words, accepted, ids, T, R)
    assert cursor.tolist() == expected
    assert [spec_cursor.unpack(w)[1] for w in expected[0]] == [1 + 3, 0, 2, 4 + 2, 3]  # slots 0 and 3: first rows


def _kernel_commit_model(cursor: list[list[int]], accepted: list[int], ids: list[int], window: int,
                         ring_len: int) -> list[list[int]]:
    """What the CUDA commit does in each layer's cursors: a row commits unless it is a pad row (an id outside the
    cursors), repeats the slot of an earlier row, has a count outside 1..window or a cursor no verify of ``window``
    could have run from."""
    out = [list(layer) for layer in cursor]
    for layer in out:
        for b, (slot, a) in enumerate(zip(ids, accepted)):
            if not 0 <= slot < len(layer) or slot in ids[:b]:
                continue
            if not 1 <= a <= window or not spec_cursor.valid(layer[slot], window, ring_len):
                continue
            origin, count = spec_cursor.unpack(layer[slot])
            layer[slot] = spec_cursor.pack(origin, count + a)
    return out


@pytest.mark.parametrize("batch,layers", [(1, 1), (200, 1), (300, 1), (200, 3), (57, 5), (128, 3), (8, 48),
                                          (3, 50), (130, 2)])
def test_commit_kernel_skips_rows_repeating_a_slot(batch, layers):
    """The CUDA commit (spec.commit, spec.commit_layers) against a model of its rule on batches of repeated slot ids,
    pad rows, ids outside the pool (-2, slots, slots + 1), bad counts and invalid cursors, over CTAs that hold part of
    a layer's rows, exactly a layer's rows or rows of several layers: a row repeating the slot of an earlier row moves
    nothing in any layer, an id outside the pool is a pad row in every layer, every other valid row commits."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from trtllm_replayssm.core.ops import spec

    gen = torch.Generator().manual_seed(batch * 10 + layers)
    T, R = 4, 19
    slots = batch // 2 + 3
    words = [[spec_cursor.pack(int(o), int(c)) for o, c in zip(
        torch.randint(0, R, (slots,), generator=gen), torch.randint(0, R - T + 2, (slots,), generator=gen))]
        for _ in range(layers)]
    ids = torch.randint(-1, slots, (batch,), generator=gen, dtype=torch.int32)  # -1: a pad row
    ids[torch.rand(batch, generator=gen) < 0.1] = PAD
    outside = torch.rand(batch, generator=gen) < 0.05
    ids[outside] = torch.tensor([-2, slots, slots + 1], dtype=torch.int32)[
        torch.randint(0, 3, (int(outside.sum()),), generator=gen)]
    accepted = torch.randint(0, T + 2, (batch,), generator=gen, dtype=torch.int32)  # 0 and T + 1: bad counts
    ids[0], accepted[0] = 0, 1  # row 0 commits in every layer
    for layer in words:
        layer[0] = spec_cursor.pack(0, 1)
    got = torch.tensor(words, dtype=torch.int32, device="cuda")
    if layers == 1:
        spec.commit(SimpleNamespace(cursor=got[0], buffer_len=R), accepted.cuda(), ids.cuda(), PAD, window=T)
    else:
        spec.commit_layers(got, R, accepted.cuda(), ids.cuda(), PAD, window=T)
    expected = _kernel_commit_model(words, accepted.tolist(), ids.tolist(), T, R)
    assert got.tolist() == expected
    assert expected != words  # some rows committed
