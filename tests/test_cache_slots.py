"""Slot rules as properties of the contract (CPU): the cursor cadence of every family, the slot lifecycle (slot 0
included), boundary ids (== slots, -2) for every slot-taking function, and hand-computed memory-plan and YAML
numbers for each family."""
from __future__ import annotations

import pytest
import torch

from trtllm_replayssm.core import checks
from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.families import FAMILIES
from trtllm_replayssm.core.samples import fill_rings_, random_state
from trtllm_replayssm.serving.bundle import serve_yaml
from trtllm_replayssm.serving.memory_plan import layer_bytes, plan
from trtllm_replayssm.serving.presets import get_preset
from trtllm_replayssm.serving.trtllm.core import decode_slot_ids
from test_row_contract import DIMS, _case, _run

SLOTS = 6


def _cache(name: str, layers: int = 2, L: int = 4) -> ReplayStateCache:
    return FAMILIES[name].new_cache(DIMS[name], layers, SLOTS, buffer_len=L, act_dtype=torch.float32, device="cpu")


# ---------------------------------------------------------------------------------------------------- cadence
@pytest.mark.parametrize("name", list(FAMILIES))
@pytest.mark.parametrize("L", (1, 2, 5))
def test_cursor_cadence_and_one_flush_per_ring(name, L):
    """Over k·L steps from staggered cursors: cursor' = 0 if cursor == L-1 else cursor + 1, and a row's checkpoint
    changes exactly at its flush steps: k per row."""
    fam = FAMILIES[name]
    gen = torch.Generator().manual_seed(L)
    cache = fam.new_cache(DIMS[name], 1, SLOTS, buffer_len=L, act_dtype=torch.float32, device="cpu")
    layer = cache.layer(0)
    layer.state.copy_(random_state(SLOTS, DIMS[name], "fp32", gen, "cpu"))
    fill_rings_(layer, gen)
    slots = [0, 2, 3, 5]
    cache.cursor[0, slots] = torch.tensor([i % L for i in range(len(slots))], dtype=torch.int32)
    k, flushes = 3, {s: 0 for s in slots}
    for _ in range(k * L):
        step = fam.random_step(DIMS[name], len(slots), gen, "cpu", torch.float32)
        before_w, before_state = cache.cursor[0].clone(), layer.state.clone()
        _run(fam, layer, step, "replay", slots)
        for s in slots:
            w = int(before_w[s])
            assert int(cache.cursor[0, s]) == (0 if w == L - 1 else w + 1), (s, w)
            changed = not torch.equal(layer.state[s], before_state[s])
            assert changed == (w == L - 1), (s, w)
            flushes[s] += changed
        unused = [s for s in range(SLOTS) if s not in slots]
        assert torch.equal(layer.state[unused], before_state[unused])
    assert flushes == {s: k for s in slots}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_flush_mode_empties_the_ring_every_step(name):
    fam, cache, layer, step = _case(name, "cpu")
    before = layer.state.clone()
    _run(fam, layer, step, "flush", [1, 2, 3, 4])
    assert cache.cursor[0, [1, 2, 3, 4]].tolist() == [0, 0, 0, 0]
    assert all(not torch.equal(layer.state[s], before[s]) for s in (1, 2, 3, 4))
    assert torch.equal(layer.state[[0, 5]], before[[0, 5]])


# ---------------------------------------------------------------------------------------------------- lifecycle
@pytest.mark.parametrize("name", list(FAMILIES))
def test_reset_slots_clears_cursor_and_arrival_counter_of_those_slots_only(name):
    cache = _cache(name)
    cache.cursor.fill_(3)
    cache.arrive.fill_(2)
    cache.reset_slots([0, 4])
    assert cache.cursor[:, [0, 4]].eq(0).all() and cache.arrive[:, [0, 4]].eq(0).all()
    assert cache.cursor[:, [1, 2, 3, 5]].eq(3).all() and cache.arrive[:, [1, 2, 3, 5]].eq(2).all()
    cache.cursor.fill_(3)
    cache.arrive.fill_(2)
    cache.reset_slots(torch.tensor([0], dtype=torch.int32), layers=[1])
    assert cache.cursor[1, 0] == 0 and cache.arrive[1, 0] == 0
    assert cache.cursor[0, 0] == 3 and cache.arrive[0, 0] == 2 and cache.cursor[1, 1:].eq(3).all()


@pytest.mark.parametrize("name", list(FAMILIES))
def test_prefill_hand_off_writes_slot_zero_and_resets_its_cursor(name):
    cache = _cache(name)
    cache.cursor.fill_(2)
    cache.arrive.fill_(1)
    layer = cache.layer(1)
    states = torch.randn(2, *layer.state.shape[1:])
    before = layer.state.clone()
    cache.load_prefill_state(1, [0, 3], states)
    assert torch.equal(layer.state[0], states[0]) and torch.equal(layer.state[3], states[1])
    assert torch.equal(layer.state[[1, 2, 4, 5]], before[[1, 2, 4, 5]])
    assert cache.cursor[1, [0, 3]].eq(0).all() and cache.arrive[1, [0, 3]].eq(0).all()
    assert cache.cursor[0].eq(2).all() and cache.cursor[1, [1, 2, 4, 5]].eq(2).all()


@pytest.mark.parametrize("call", ("reset", "prefill"))
@pytest.mark.parametrize("ids, error, message", [
    ([SLOTS], ValueError, rf"^slot_ids: values must be in \[0, {SLOTS}\), got \[{SLOTS}\]"),
    ([-2], ValueError, rf"^slot_ids: values must be in \[0, {SLOTS}\), got \[-2\]"),
    ([1, 1], ValueError, r"^slot_ids: each slot at most once per call, got repeated ids \[1\]"),
    ([True], TypeError, r"^slot_ids: expected ints"),
    ([1.0], TypeError, r"^slot_ids: expected ints"),
    (torch.tensor([1.0]), TypeError, r"^slot_ids: expected an int32 or int64 tensor, got torch.float32"),
    (torch.tensor([True]), TypeError, r"^slot_ids: expected an int32 or int64 tensor, got torch.bool"),
])
def test_slot_id_errors_touch_nothing(call, ids, error, message):
    cache = _cache("mamba2")
    cache.cursor.fill_(1)
    before = [t.clone() for t in (cache.cursor, cache.arrive, cache.layer(0).state)]
    n = len(ids)
    with pytest.raises(error, match=message):
        if call == "reset":
            cache.reset_slots(ids)
        else:
            cache.load_prefill_state(0, ids, torch.zeros(n, *cache.layer(0).state.shape[1:]))
    assert all(torch.equal(a, b) for a, b in zip(before, (cache.cursor, cache.arrive, cache.layer(0).state)))


def test_largest_slot_id_is_accepted_everywhere():
    cache = _cache("gdn")
    cache.cursor.fill_(1)
    cache.reset_slots([SLOTS - 1])
    assert cache.cursor[:, SLOTS - 1].eq(0).all()
    checks.check_slot_values("ids", torch.tensor([0, SLOTS - 1]), SLOTS)
    assert checks.slot_indices("ids", torch.tensor([SLOTS - 1, 0], dtype=torch.int32), 2, SLOTS, -1,
                               torch.device("cpu")).tolist() == [SLOTS - 1, 0]


@pytest.mark.parametrize("bad", (True, 0, -1, 2.0))
def test_cache_sizes_must_be_positive_ints(bad):
    with pytest.raises(ValueError, match=r"^slots: expected a positive int, got "):
        ReplayStateCache.gdn(1, bad, 2, 4, 64, 16, buffer_len=4, device="cpu")
    with pytest.raises(ValueError, match=r"^buffer_len: expected an integer in \[1, 32\], got "):
        ReplayStateCache.mamba2(1, 4, 4, 16, 32, 2, buffer_len=bad if bad is not True else True, device="cpu")


def test_slot_indices_boundaries():
    cpu = torch.device("cpu")
    ids = lambda *v: torch.tensor(v, dtype=torch.int32)  # noqa: E731
    assert checks.slot_indices("ids", ids(0, -1, 5), 3, 6, -1, cpu).tolist() == [0, -1, 5]
    for bad in (6, -2):
        with pytest.raises(ValueError, match=rf"^ids: values must be in \[0, 6\) or pad_slot_id=-1, got \[{bad}\]"):
            checks.slot_indices("ids", ids(0, bad), 2, 6, -1, cpu)
    assert checks.slot_indices("ids", ids(6, 6, 0), 3, 6, 6, cpu).tolist() == [6, 6, 0]  # pads may repeat
    with pytest.raises(ValueError, match=r"^ids: batch 7 exceeds the 6 cache slots"):
        checks.slot_indices("ids", None, 7, 6, -1, cpu)
    assert checks.slot_indices("ids", None, 6, 6, -1, cpu).tolist() == list(range(6))


def test_decode_slot_ids_boundaries():
    got = decode_slot_ids(torch.tensor([0, 5, 6, -2, 3, 3, 0, 7]), num_slots=6)
    assert got.dtype == torch.int32
    assert got.tolist() == [0, 5, -1, -1, 3, -1, -1, -1]
    assert decode_slot_ids(torch.tensor([2, 2]), num_slots=6, pad_slot_id=9).tolist() == [2, 9]
    with pytest.raises(ValueError, match=r"^num_slots: expected a positive integer, got 0"):
        decode_slot_ids(torch.tensor([0]), num_slots=0)
    with pytest.raises(ValueError, match=r"^decode_slots: expected a 1-D tensor"):
        decode_slot_ids(torch.zeros(2, 2, dtype=torch.int64), num_slots=6)


# ---------------------------------------------------------------------------------------------------- plans
@pytest.mark.parametrize("model, record, checkpoint", [
    # Mamba-2 Nano-4B: x ring 96 heads x 80 x bf16, B ring 8 groups x 128 x bf16, Δ ring 96 x fp32
    ("nemotron-3-nano-4b", 96 * 80 * 2 + 8 * 128 * 2 + 96 * 4, 96 * 80 * 128 * 4),
    # GDN Qwen3.5-4B: u ring 32 value heads x 128 x bf16, key ring 16 key heads x 128 x bf16, gate 32 x fp32
    ("qwen3.5-4b", 32 * 128 * 2 + 16 * 128 * 2 + 32 * 4, 32 * 128 * 128 * 4),
    # KDA Kimi-Linear-48B: u ring 32 x 128 x bf16, pre-decayed keys 32 x 128 x bf16, gates 32 x 128 x fp32
    ("kimi-linear-48b", 32 * 128 * 2 + 32 * 128 * 2 + 32 * 128 * 4, 32 * 128 * 128 * 4),
])
def test_memory_plan_by_hand(model, record, checkpoint):
    spec = get_preset(model)
    lb = layer_bytes(spec, 1, 16, "fp32")
    assert (lb.record, lb.ring, lb.checkpoint, lb.cursors) == (record, 16 * record, checkpoint, 8)
    mp = plan(spec, "h200", max_batch_size=64)
    assert mp.ring_bytes_per_gpu == len(spec.ssm_layers) * (16 * record + 8) * 65
    assert mp.per_seq_replay == len(spec.ssm_layers) * (checkpoint + 16 * record + 8 + lb.conv)
    # the real cache allocates exactly the planned ring bytes per slot
    fam = FAMILIES[spec.ssm_dims.family]
    cache = fam.new_cache(spec.ssm_dims, 1, 2, buffer_len=16, device="meta")
    layer = cache.layer(0)
    rings = sum(t[0].numel() * t.element_size() for n, t in layer.slot_tensors().items()
                if n not in ("state", "cursor", "arrive"))
    assert rings == 16 * record


@pytest.mark.parametrize("max_batch, sizes", [
    (1, [1]), (3, [1, 2, 3]), (8, [1, 2, 4, 8]), (48, [1, 2, 4, 8, 16, 32, 48]),
    (256, [1, 2, 4, 8, 16, 32, 64, 128, 256]),
])
def test_yaml_graph_batch_sizes(max_batch, sizes):
    spec = get_preset("qwen3.5-4b")
    text = serve_yaml(spec, plan(spec, "h200", max_batch_size=max_batch))
    assert f"  batch_sizes: [{', '.join(map(str, sizes))}]\n" in text
    assert f"max_batch_size: {max_batch}\n" in text


# ---------------------------------------------------------------------------------------------------- factories
def test_factory_defaults():
    """Defaults of every factory: L = 16, checkpoints allocated (fp32), bf16 rings."""
    for cache in (ReplayStateCache.mamba2(1, 2, 4, 16, 32, 2, device="cpu"),
                  ReplayStateCache.gdn(1, 2, 2, 4, 64, 16, device="cpu"),
                  ReplayStateCache.kda(1, 2, 2, 64, device="cpu")):
        layer = cache.layer(0)
        assert cache.buffer_len == 16 == layer.buffer_len
        assert layer.state is not None and layer.state.dtype == torch.float32
        assert cache.act_dtype == torch.bfloat16


def test_factory_shape_errors():
    with pytest.raises(ValueError, match=r"^ngroups: must divide nheads=4, got 3"):
        ReplayStateCache.mamba2(1, 2, 4, 16, 32, 3, device="cpu")
    with pytest.raises(ValueError, match=r"^num_k_heads: must divide num_v_heads=4, got 3"):
        ReplayStateCache.gdn(1, 2, 3, 4, 64, 16, device="cpu")
    with pytest.raises(ValueError, match=r"^nheads: expected a positive int, got 0"):
        ReplayStateCache.mamba2(1, 2, 0, 16, 32, 2, device="cpu")


def test_layer_index_and_rings_only_cache_errors():
    cache = ReplayStateCache.kda(2, 3, 2, 64, buffer_len=4, device="cpu", checkpoints=False)
    for bad in (2, -1):
        with pytest.raises(IndexError, match=rf"^layer: expected an index in \[0, 2\), got {bad}"):
            cache.layer(bad)
    with pytest.raises(ValueError, match=r"^load_prefill_state: this cache holds no checkpoints"):
        cache.load_prefill_state(0, [0], torch.zeros(1, *cache.state_shape))
    with pytest.raises(ValueError, match=r"^layer.state: no checkpoint bound"):
        cache.layer(0).require_state()


def test_prefill_states_shape_error():
    cache = _cache("gdn")
    with pytest.raises(ValueError, match=r"^states: expected shape \(2, 4, 16, 64\), got \(1, 4, 16, 64\)"):
        cache.load_prefill_state(0, [0, 1], torch.zeros(1, 4, 16, 64))


@pytest.mark.parametrize("name", list(FAMILIES))
def test_bytes_per_slot_counts_scratch_once(name):
    cache = _cache(name, layers=3)
    layer = cache.layer(0)
    own = sum(t[0].numel() * t.element_size() for n, t in layer.tensors().items() if n not in ("coef", "step"))
    shared = layer.coef[0].numel() * 4 + layer.step[0].numel() * 4
    assert layer.nbytes_per_slot() == own
    assert layer.nbytes_per_slot(include_shared=True) == own + shared
    assert cache.bytes_per_slot() == 3 * own + shared


def test_with_checkpoint_and_reset_layer_errors():
    cache = _cache("mamba2")
    for bad, got in (("x", "str"), (torch.zeros(SLOTS, 4, 16), r"\(6, 4, 16\)")):
        with pytest.raises(ValueError, match=rf"^state: expected shape \(6, 4, 16, 32\), got {got}"):
            cache.with_checkpoint(0, bad)
    with pytest.raises(ValueError, match=r"^state: expected torch.float32 on cpu, got torch.float64 on cpu"):
        cache.with_checkpoint(0, torch.zeros(SLOTS, 4, 16, 32, dtype=torch.float64))
    view = cache.with_checkpoint(1, torch.ones(SLOTS, 4, 16, 32))
    assert view.state.eq(1).all() and view.x_ring is cache.layer(1).x_ring
    cache.cursor.fill_(2)
    with pytest.raises(IndexError, match=r"^layer: expected an index in \[0, 2\), got 2"):
        cache.reset_slots([0], layers=[0, 2])
    assert cache.cursor.eq(2).all()  # nothing written before the error


def test_serving_rejects_a_bool_ring_length(tmp_path):
    from trtllm_replayssm.serving.trtllm import load_settings
    from trtllm_replayssm.serving.trtllm.model_cache import ModelReplayCache
    with pytest.raises(ValueError, match=r"^buffer_len: expected an integer in \[1, 32\], got True"):
        ModelReplayCache("gdn", [0, 2], 2, True, torch.bfloat16)
    manifest = tmp_path / "manifest.json"
    manifest.write_text('{"buffer_len": true, "dtypes": {"activation": "bf16"}, "plan": {"family": "gdn"}, '
                        '"memory": {"ring_bytes_per_gpu": 1, "max_batch_size": 8}}')
    with pytest.raises(ValueError, match=r"^buffer_len: expected an integer in \[1, 32\], got True"):
        load_settings(manifest)


def test_bytes_per_slot_of_a_one_layer_one_slot_cache():
    cache = ReplayStateCache.gdn(1, 1, 2, 4, 64, 16, buffer_len=4, act_dtype=torch.float32, device="cpu")
    # by hand per layer: state 4x16x64 fp32, u ring 4x4x16, k ring 2x4x64, g ring 4x4 (fp32), cursor + arrive
    own = 4 * (4 * 16 * 64 + 4 * 4 * 16 + 2 * 4 * 64 + 4 * 4 + 2)
    layer = cache.layer(0)
    shared = 4 * layer.coef[0].numel() + 4 * layer.step[0].numel()
    assert cache.bytes_per_slot() == own + shared
