"""The row contract of every family's ops (docs/design.md, "Rows a step skips" and "NaN and Inf").

CPU: bad slot ids, repeated ids and corrupted cursors are errors before anything is touched; custom pad ids (0
included) give zero outputs and touch no slot; ``check_values`` finds non-finite inputs; a NaN stays in its slot
until a prefill hand-off. GPU (and under compute-sanitizer memcheck in build_scripts/gpu_check.sh): the kernels skip
such rows (zero output, no write), every other row is what a clean step gives.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.families import FAMILIES
from trtllm_replayssm.core.samples import fill_rings_, random_state

L = 8
SLOTS = 6
DIMS = {"mamba2": Mamba2Dims(nheads=4, head_dim=16, d_state=32, n_groups=2),
        "gdn": GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=16),
        "kda": KDADims(num_heads=2, head_dim=64)}
OPS = ("baseline", "flush", "fused", "replay")


def _case(name: str, device: str, seed: int = 0, batch: int = 4):
    fam, dims = FAMILIES[name], DIMS[name]
    gen = torch.Generator().manual_seed(seed)
    cache = fam.new_cache(dims, 1, SLOTS, buffer_len=L, act_dtype=torch.float32, device=device)
    layer = cache.layer(0)
    layer.state.copy_(random_state(SLOTS, dims, "fp32", gen, device))
    fill_rings_(layer, gen)
    cache.cursor.copy_(torch.randint(0, L, (1, SLOTS), generator=gen, dtype=torch.int32))
    step = fam.random_step(dims, batch, gen, device, torch.float32)
    return fam, cache, layer, step


def _run(fam, layer, step, op: str, idx: list[int], pad_slot_id: int = -1, **kw) -> torch.Tensor:
    args, kwargs = step.op_args()
    ids = torch.tensor(idx, dtype=torch.int32, device=layer.state.device)
    out = torch.full_like(args[0] if fam.name == "mamba2" else args[2], float("nan"))
    if op == "baseline":
        return fam.state_update(layer.state, *args, **kwargs, state_batch_indices=ids, pad_slot_id=pad_slot_id,
                                out=out, **kw)
    return fam.replay_decode(layer, *args, **kwargs, state_batch_indices=ids, pad_slot_id=pad_slot_id, out=out,
                             mode=op, **kw)


def _snapshot(cache, layer) -> list[torch.Tensor]:
    """Copies of the layer's per-slot tensors (checkpoint, rings, cursor, arrival counter), dim 0 the slot."""
    return [t.clone() for t in layer.slot_tensors().values()]


def _slot_rows(tensors: list[torch.Tensor], slot: int) -> list[torch.Tensor]:
    return [t[slot] for t in tensors]


# ---------------------------------------------------------------------------------------------------- CPU
@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("idx, message", [
    ([1, SLOTS, 2, 3], rf"values must be in \[0, {SLOTS}\) or pad_slot_id=-1, got \[{SLOTS}\]"),
    ([1, -2, 2, 3], r"values must be in \[0, 6\) or pad_slot_id=-1, got \[-2\]"),
    ([1, 4, 2, 4], r"each slot at most once per call, got repeated ids \[4\]"),
])
def test_bad_slot_ids_are_errors_before_any_write(name, op, idx, message):
    fam, cache, layer, step = _case(name, "cpu")
    before = _snapshot(cache, layer)
    with pytest.raises(ValueError, match=r"^state_batch_indices: " + message):
        _run(fam, layer, step, op, idx)
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(cache, layer)))


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("op", ("flush", "fused", "replay"))
@pytest.mark.parametrize("bad", (L, -1, 1 << 30))
def test_corrupted_cursor_is_an_error_before_any_write(name, op, bad):
    fam, cache, layer, step = _case(name, "cpu")
    cache.cursor[0, 3] = bad
    before = _snapshot(cache, layer)
    with pytest.raises(ValueError, match=rf"^layer.cursor: expected values in \[0, {L}\) .*\{{3: {bad}\}}"):
        _run(fam, layer, step, op, [1, 3, 2, 5])
    assert all(torch.equal(a, b) for a, b in zip(before, _snapshot(cache, layer)))


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("pad", (0, SLOTS + 3, -7))
def test_custom_pad_id_rows_are_zero_and_touch_no_slot(name, op, pad):
    """pad_slot_id 0 makes slot 0 a pad; an id equal to -1 is then an error, not a pad."""
    fam, cache, layer, step = _case(name, "cpu")
    before = _snapshot(cache, layer)
    out = _run(fam, layer, step, op, [2, pad, 4, pad], pad_slot_id=pad)
    assert torch.equal(out[1], torch.zeros_like(out[1])) and torch.equal(out[3], torch.zeros_like(out[3]))
    assert torch.isfinite(out[[0, 2]]).all()
    after = _snapshot(cache, layer)
    for slot in range(SLOTS):
        if slot not in (2, 4):
            assert all(torch.equal(a, b) for a, b in zip(_slot_rows(before, slot), _slot_rows(after, slot))), slot
    if pad >= 0:
        with pytest.raises(ValueError, match=rf"^state_batch_indices: values must be in \[0, {SLOTS}\) or "
                                             rf"pad_slot_id={pad}, got \[-1\]"):
            _run(fam, layer, step, op, [2, -1, 4, pad], pad_slot_id=pad)


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("bad", (True, 1.0, "0"))
def test_pad_slot_id_must_be_an_int(name, bad):
    fam, cache, layer, step = _case(name, "cpu")
    with pytest.raises(TypeError, match=r"^pad_slot_id: expected an int, got "):
        _run(fam, layer, step, "replay", [1, 2, 3, 4], pad_slot_id=bad)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_slot_ids_must_be_int32(name):
    fam, cache, layer, step = _case(name, "cpu")
    args, kwargs = step.op_args()
    for dtype in (torch.int64, torch.float32, torch.bool):
        ids = torch.tensor([1, 2, 3, 4]).to(dtype)
        with pytest.raises(TypeError, match=r"^state_batch_indices: expected dtype in \['torch.int32'\]"):
            fam.replay_decode(layer, *args, **kwargs, state_batch_indices=ids)


@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("op", OPS)
def test_check_values_names_the_non_finite_input(name, op):
    fam, cache, layer, step = _case(name, "cpu")
    field = "x" if name == "mamba2" else "v"
    getattr(step, field)[2].view(-1)[5] = float("nan")
    with pytest.raises(ValueError, match=rf"^{field}: expected finite values, got nan at index \[2, "):
        _run(fam, layer, step, op, [1, 2, 3, 4], check_values=True)
    getattr(step, field)[2].view(-1)[5] = 0.0
    param = "A" if name == "mamba2" else "A_log"
    getattr(step, param)[1] = float("-inf")
    with pytest.raises(ValueError, match=rf"^{param}: expected finite values, got -inf at index \[1\]"):
        _run(fam, layer, step, op, [1, 2, 3, 4], check_values=True)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_check_values_ignores_pad_rows(name):
    fam, cache, layer, step = _case(name, "cpu")
    getattr(step, "x" if name == "mamba2" else "v")[1].fill_(float("nan"))
    out = _run(fam, layer, step, "replay", [1, -1, 3, 4], check_values=True)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_a_nan_stays_in_its_slot_until_a_prefill_hand_off(name):
    """NaN policy: the row's output is NaN; from the next flush its slot's checkpoint is NaN (every later output of
    that slot too); no other slot changes; load_prefill_state makes the slot finite again."""
    fam, cache, layer, step = _case(name, "cpu")
    cache.cursor.zero_()
    field = "x" if name == "mamba2" else "v"
    poisoned = getattr(step, field).clone()
    poisoned[0] = float("nan")
    args = [1, 2, 3, 4]
    out = _run(fam, layer, dataclasses.replace(step, **{field: poisoned}), "replay", args)
    assert torch.isnan(out[0]).any() and torch.isfinite(out[1:]).all()
    for _ in range(L):  # through the slot's next flush
        out = _run(fam, layer, step, "replay", args)
        assert torch.isfinite(out[1:]).all()
    assert torch.isnan(layer.state[1]).any() and torch.isnan(out[0]).any()
    assert all(torch.isfinite(layer.state[s]).all() for s in (0, 2, 3, 4, 5))
    cache.load_prefill_state(0, [1], torch.zeros(1, *layer.state.shape[1:]))
    out = _run(fam, layer, step, "replay", args)
    assert torch.isfinite(out).all()


def test_mamba2_decay_of_infinite_A_matches_the_baseline():
    """A = -inf (A_log = inf) decays the checkpoint to nothing in one step; replay, flush and baseline agree and stay
    finite (the exponent A·ΣΔ is 0 where ΣΔ is 0)."""
    outs = []
    for op in OPS:
        fam, cache, layer, step = _case("mamba2", "cpu", seed=3)
        cache.cursor.zero_()
        step.A[1] = float("-inf")
        out = _run(fam, layer, step, op, [1, 2, 3, 4])
        assert torch.isfinite(out).all(), op
        outs.append(out)
    torch.testing.assert_close(outs[1], outs[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(outs[2], outs[0], rtol=1e-5, atol=1e-6)


# ---------------------------------------------------------------------------------------------------- GPU
CORRUPTIONS = {  # name: (slot ids of the step, {slot: cursor} written before it, rows the kernels skip)
    "id == slots": ([1, SLOTS, 2, 3], {}, [1]),
    "id -2": ([1, -2, 2, 3], {}, [1]),
    "huge id": ([1, 1 << 30, 2, -(1 << 30)], {}, [1, 3]),
    "repeated id": ([4, 2, 4, 2], {}, [2, 3]),
    "cursor == L": ([1, 3, 2, 5], {3: L}, [1]),
    "cursor -1": ([1, 3, 2, 5], {3: -1}, [1]),
    "huge cursor": ([1, 3, 2, 5], {3: 1 << 30, 5: -(1 << 30)}, [1, 3]),
}


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("op", OPS)
@pytest.mark.parametrize("corruption", list(CORRUPTIONS))
def test_kernels_skip_corrupted_rows(name, op, corruption):
    """A corrupted row writes zeros and touches no slot; the other rows equal a clean step of those rows alone
    (the skipped rows as pads). Run under compute-sanitizer memcheck too: no access outside a slot."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    idx, cursors, skipped = CORRUPTIONS[corruption]
    if op == "baseline" and cursors:
        pytest.skip("the baseline reads no cursor")
    seed = list(CORRUPTIONS).index(corruption)
    fam, cache, layer, step = _case(name, "cuda", seed=seed)
    for slot, w in cursors.items():
        cache.cursor[0, slot] = w
    before = _snapshot(cache, layer)
    out = _run(fam, layer, step, op, idx)
    torch.cuda.synchronize()
    after = _snapshot(cache, layer)
    if op == "baseline" and corruption == "repeated id":  # not detected by the baseline kernels: rows race in-slot
        assert torch.isfinite(out).all()
        for slot in set(range(SLOTS)) - set(idx):
            assert all(torch.equal(a, b) for a, b in zip(_slot_rows(after, slot), _slot_rows(before, slot))), slot
        return
    assert (out[skipped] == 0).all()

    fam2, cache2, layer2, _ = _case(name, "cuda", seed=seed)
    for slot, w in cursors.items():
        cache2.cursor[0, slot] = w
    clean = [-1 if r in skipped else s for r, s in enumerate(idx)]
    expected = _run(fam2, layer2, step, op, clean)
    torch.cuda.synchronize()
    live = [r for r in range(len(idx)) if r not in skipped]
    torch.testing.assert_close(out[live], expected[live], rtol=0, atol=0)
    written = {idx[r] for r in live}
    for slot in range(SLOTS):
        now, then = _slot_rows(after, slot), _slot_rows(before, slot)
        if slot in written:
            assert all(torch.equal(a, b) for a, b in zip(now, _slot_rows(_snapshot(cache2, layer2), slot))), slot
        else:
            assert all(torch.equal(a, b) for a, b in zip(now, then)), slot
