"""The model-level replay cache, the all-or-nothing mixer swap and the refusals (TensorRT-LLM-free core of the
serving glue). Upstream's pools are rebuilt from its source in upstream_pools.py; the mixer stand-ins below are plain
torch modules that test the swap logic only, not TensorRT-LLM's mixers."""
import logging
from types import SimpleNamespace

import pytest
import torch

from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.formats import parse_state_label
from trtllm_replayssm.serving.trtllm.core import (MTP_CUSTOM_OP_ENV, refusals_from_cache_manager,
                                                  refusals_from_llm_args, refusals_from_quant_config,
                                                  speculative_refusals)
from trtllm_replayssm.serving.trtllm.install import ReplayModel
from trtllm_replayssm.serving.trtllm.model_cache import ModelReplayCache

from upstream_pools import PythonPool, UnifiedPool

STATE = (4, 16, 32)  # Mamba-2 [H, P, N]


def _unified(blocks=9):
    return UnifiedPool([2, 5, 7], blocks, STATE, torch.float32, conv_bytes=3 * 16 * 8, device="cpu")


def test_unified_pool_views_are_fresh_and_strided():
    pool = _unified()
    a, b = pool.get_ssm_states(5), pool.get_ssm_states(5)
    assert a is not b and a.data_ptr() == b.data_ptr()
    assert a.shape == (9, *STATE) and a.stride(0) == (pool.ssm_bytes + 3 * 16 * 8) // 4 and not a.is_contiguous()


def test_one_bind_for_all_layers_across_fresh_views():
    pool = _unified()
    cache = ModelReplayCache("mamba2", [2, 5, 7], num_k_heads=2, buffer_len=4, act_dtype=torch.bfloat16)
    for _ in range(3):
        for layer_id in (2, 5, 7):
            layer = cache.layer(layer_id, pool.get_ssm_states(layer_id))
            assert layer.state.data_ptr() == pool.get_ssm_states(layer_id).data_ptr()
    assert cache.binds == 1 and cache.cache.num_layers == 3 and cache.cache.slots == 9
    assert layer.x_ring.shape == (9, 4, 4, 16) and layer.B_ring.shape == (9, 2, 4, 32)
    # no second checkpoint copy: the cache's own layers hold no state
    assert all(cache.cache.layer(i).state is None for i in range(3))
    assert cache.ring_bytes() == cache.cache.bytes_per_slot() * 9 > 0


def test_shared_scratch_and_per_layer_rings():
    pool = PythonPool([0, 1], 5, STATE, torch.float32, "cpu")
    cache = ModelReplayCache("mamba2", [0, 1], num_k_heads=2, buffer_len=4, act_dtype=torch.bfloat16)
    a, b = cache.layer(0, pool.get_ssm_states(0)), cache.layer(1, pool.get_ssm_states(1))
    assert a.coef is b.coef and a.step is b.step
    assert a.x_ring.data_ptr() != b.x_ring.data_ptr() and a.cursor.data_ptr() != b.cursor.data_ptr()


def test_new_pool_rebinds_and_capture_is_refused(monkeypatch):
    cache = ModelReplayCache("mamba2", [2, 5, 7], num_k_heads=2, buffer_len=4, act_dtype=torch.bfloat16)
    cache.layer(2, _unified().get_ssm_states(2))
    bigger = _unified(blocks=13)  # the serving manager after the estimation one: another pool, more blocks
    assert cache.layer(2, bigger.get_ssm_states(2)).slots == 13 and cache.binds == 2
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: True)
    with pytest.raises(RuntimeError, match="during CUDA-graph capture"):
        cache.layer(2, _unified(blocks=11).get_ssm_states(2))


def test_layer_and_state_checks():
    cache = ModelReplayCache("mamba2", [2, 5], num_k_heads=2, buffer_len=4, act_dtype=torch.bfloat16)
    pool = _unified()
    with pytest.raises(ValueError, match="layer_id: expected one of"):
        cache.layer(3, pool.get_ssm_states(2))
    cache.layer(2, pool.get_ssm_states(2))
    with pytest.raises(ValueError, match="state: expected"):
        cache.cache.with_checkpoint(0, torch.zeros(9, 4, 16, 32, dtype=torch.bfloat16))
    with pytest.raises(ValueError, match="layer_ids"):
        ModelReplayCache("mamba2", [1, 1], 2, 4, torch.bfloat16)
    with pytest.raises(ValueError, match="no checkpoint bound"):
        cache.cache.layer(0).require_state()


def test_prefill_handoff_once_per_step_in_every_layer():
    pool = _unified()
    cache = ModelReplayCache("mamba2", [2, 5, 7], num_k_heads=2, buffer_len=4, act_dtype=torch.bfloat16)
    state_indices = torch.tensor([6, 1, 3, 8], dtype=torch.int32)  # contexts first
    cache.begin_step()
    cache.layer_step(2, pool.get_ssm_states(2), state_indices, num_contexts=0)
    cache.end_step()
    cache.cache.cursor.fill_(2)
    cache.begin_step()
    for layer_id in (2, 5, 7):
        cache.layer_step(layer_id, pool.get_ssm_states(layer_id), state_indices, num_contexts=2)
        cache.cache.cursor[:, 3] = 3  # a decode row's cursor moving within the step is not reset again
    cache.end_step()
    assert cache.cache.cursor[:, 6].tolist() == [0, 0, 0] and cache.cache.cursor[:, 1].tolist() == [0, 0, 0]
    assert cache.cache.cursor[:, 3].tolist() == [3, 3, 3] and cache.cache.cursor[:, 8].tolist() == [2, 2, 2]


def test_decode_slots_once_per_step_and_only_inside_one():
    pool = _unified()
    cache = ModelReplayCache("mamba2", [2, 5], num_k_heads=2, buffer_len=4, act_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="outside a model forward"):
        cache.decode_slots(torch.tensor([1], dtype=torch.int32))
    cache.begin_step()
    cache.layer(2, pool.get_ssm_states(2))
    first = cache.decode_slots(torch.tensor([4, 8, 8], dtype=torch.int32))  # graph padding repeats the dummy
    assert first.tolist() == [4, 8, -1] and cache.decode_slots(torch.tensor([0, 0, 0])) is first
    cache.end_step()
    cache.begin_step()
    assert cache.decode_slots(torch.tensor([0, 1, 2], dtype=torch.int32)).tolist() == [0, 1, 2]


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_served_decode_launches_the_state_kernels_plainly(family):
    """decode_plan: the state kernels launched plainly with no L2 hints, where the shipped plan launches them as
    programmatic dependents (small batches on an H200), in the mode the crossover entry of plainly launched kernels
    gives (replay from its replay threshold, fused from its fused one, else flush)."""
    from trtllm_replayssm.core import crossovers
    from trtllm_replayssm.core.families import get_family
    from trtllm_replayssm.core.plans import Device, Launch

    h200 = Device(132, 9)
    cache, layer, shape = _served_layer(family)
    plain = crossovers.entry(family, "fp32", h200.arch, launch="plain")
    assert plain.launch == "plain"  # measured for the served launch
    programmatic_before = []
    for rows in (1, 8, 64, 256):
        served = cache.decode_plan(layer, rows, device=h200)
        programmatic_before.append(get_family(family).replay_plan(layer, rows, "auto", device=h200).programmatic)
        work = rows * shape[0] / h200.sm_count
        fused = plain.fused_min_work_per_sm is not None and work >= plain.fused_min_work_per_sm
        assert served.mode == ("replay" if work >= plain.min_work_per_sm else "fused" if fused else "flush")
        assert not served.programmatic and not served.l2_hints
        launch = Launch.from_words(served.words)
        assert not launch.programmatic and not launch.l2_hints
    assert programmatic_before[0]  # the shipped plan at batch 1 is a programmatic one: the served plan differs there


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_decode_right_after_our_conv_launches_the_state_kernels_as_its_dependents(family):
    """decode_plan(after_conv=True): the plan the module uses after its own conv1d step (every family) is the shipped
    programmatic one, L2 hints included where the shipped plan has them."""
    from trtllm_replayssm.core.families import get_family
    from trtllm_replayssm.core.plans import Device

    h200 = Device(132, 9)
    cache, layer, _ = _served_layer(family)
    for rows in (1, 8, 64, 256):
        after_conv = cache.decode_plan(layer, rows, device=h200, after_conv=True)
        assert after_conv == get_family(family).replay_plan(layer, rows, "auto", device=h200)
    assert cache.decode_plan(layer, 1, device=h200, after_conv=True).programmatic


def test_decode_rows_are_views_of_one_buffer():
    pool = _unified()
    cache = ModelReplayCache("mamba2", [2, 5], num_k_heads=2, buffer_len=4, act_dtype=torch.bfloat16)
    with pytest.raises(RuntimeError, match="before any layer bound"):
        cache.decode_rows(1)
    state = pool.get_ssm_states(2)
    cache.layer(2, state)
    rows = cache.decode_rows(3)
    assert rows.tolist() == [0, 1, 2] and rows.dtype == torch.int32
    assert cache.decode_rows(5).data_ptr() == rows.data_ptr()  # no allocation per call
    for bad in (0, state.shape[0] + 1):
        with pytest.raises(ValueError, match="num_decodes: expected 1 to"):
            cache.decode_rows(bad)


# ---------------------------------------------------------------------------------------------------- the swap
class Upstream(torch.nn.Module):
    def __init__(self, layer_idx):
        super().__init__()
        self.layer_idx = layer_idx
        self.weight = torch.nn.Parameter(torch.ones(1))


class Replay(Upstream):
    setups = 0

    @staticmethod
    def _rs_cannot_hook(module):
        return None if module.layer_idx >= 0 else "layer_idx is negative"

    def _rs_num_k_heads(self):
        return 2

    def _rs_setup(self, cache):
        self._rs_cache = cache

    def _rs_teardown(self):
        del self._rs_cache


class Toy(torch.nn.Module):
    def __init__(self, ids):
        super().__init__()
        self.layers = torch.nn.ModuleList([Upstream(i) for i in ids] + [torch.nn.Linear(2, 2)])


def _install(model, refusals=()):
    return ReplayModel.install(model, "ToyForCausalLM", "mamba2", {Upstream: Replay}, 4, torch.bfloat16, refusals)


def test_install_swaps_every_mixer_and_keeps_parameters(caplog):
    caplog.set_level(logging.INFO, "trtllm_replayssm")
    model = Toy([1, 3])
    params = [p for p in model.parameters()]
    replay = _install(model)
    assert [type(m) for m in model.layers[:2]] == [Replay, Replay] and list(model.parameters()) == params
    assert replay.cache.layer_ids == (1, 3) and model.layers[0]._rs_cache is replay.cache
    assert any("2 mamba2 layers run ReplaySSM decode (L=4)" in r.getMessage() for r in caplog.records)
    manager = SimpleNamespace(enable_block_reuse=False, kv_connector_manager=None, is_speculative=lambda: False)
    assert replay.begin_step(SimpleNamespace(kv_cache_manager=manager))  # no beam_width: one beam
    replay.cache.layer(1, _unified().get_ssm_states(2))  # a pool's state view (the toy's ids are not its layers)
    replay.cache.decode_slots(torch.tensor([0], dtype=torch.int32))  # inside the step the begin opened
    replay.end_step()
    with pytest.raises(RuntimeError, match="outside a model forward"):
        replay.cache.decode_slots(torch.tensor([0], dtype=torch.int32))


def test_one_mixer_model_installs():
    replay = _install(Toy([5]))
    assert replay.active and replay.cache.layer_ids == (5,)


def test_beam_search_falls_back_at_the_first_step():
    manager = SimpleNamespace(enable_block_reuse=False, kv_connector_manager=None, is_speculative=lambda: False)
    replay = _install(Toy([1, 3]))
    assert replay.begin_step(SimpleNamespace(kv_cache_manager=manager, beam_width=None))  # unset: one beam
    replay.end_step()
    replay = _install(Toy([1, 3]))
    assert not replay.begin_step(SimpleNamespace(kv_cache_manager=manager, beam_width=4)) and not replay.active


def test_refusals_keep_or_restore_upstream_as_a_whole(caplog):
    caplog.set_level(logging.WARNING, "trtllm_replayssm")
    model = Toy([1, 3])
    assert _install(model, ["speculative_config is set: x"]) is None
    assert all(type(m) is Upstream for m in model.layers[:2])
    replay = _install(model)
    manager = SimpleNamespace(enable_block_reuse=True, kv_connector_manager=None)
    assert not replay.begin_step(SimpleNamespace(kv_cache_manager=manager, beam_width=1))
    assert all(type(m) is Upstream and not hasattr(m, "_rs_cache") for m in model.layers[:2])
    assert not replay.begin_step(SimpleNamespace(kv_cache_manager=manager, beam_width=1))
    lines = [r.getMessage() for r in caplog.records]
    assert any("speculative_config" in line for line in lines) and any("enable_block_reuse" in line for line in lines)


def test_speculative_install_takes_over_the_managers_commit():
    model = Toy([1, 3])
    replay = ReplayModel.install(model, "ToyForCausalLM", "mamba2", {Upstream: Replay}, 6, torch.float32,
                                 spec_tokens=2)
    assert replay.cache.window == 3
    asked = []
    layer_cache = SimpleNamespace(intermediate_conv_window=torch.zeros(2, 3, 4, 3), has_kda_replay_caches=False)
    manager = SimpleNamespace(enable_block_reuse=False, kv_connector_manager=None, is_speculative=lambda: True,
                              use_replay_state_update=False,
                              mamba_layer_cache=lambda i: asked.append(i) or layer_cache,
                              update_mamba_states=lambda *a, **k: None)
    assert replay.begin_step(SimpleNamespace(kv_cache_manager=manager, beam_width=1))
    replay.end_step()
    assert asked == [1]  # the model's first SSM layer's cache: its per-draft conv windows are there
    bound = manager.update_mamba_states
    assert bound.func == replay.cache.update_mamba_states and bound.args == (manager,)
    # TensorRT-LLM's own MTP replay bypasses the hooked SSU: the model falls back as a whole, the manager untouched
    model = Toy([1, 3])
    replay = ReplayModel.install(model, "ToyForCausalLM", "mamba2", {Upstream: Replay}, 6, torch.float32,
                                 spec_tokens=2)
    upstream_commit = manager.update_mamba_states = (lambda *a, **k: None)
    manager.use_replay_state_update = True
    assert not replay.begin_step(SimpleNamespace(kv_cache_manager=manager, beam_width=1))
    assert manager.update_mamba_states is upstream_commit and all(type(m) is Upstream for m in model.layers[:2])


def test_every_new_cache_manager_is_checked_and_its_commit_taken_over(caplog):
    """TensorRT-LLM serves with another cache manager than its memory-estimation pass's: the serving manager gets the
    checks and, with MTP, the commit takeover too (its own commit would copy per-draft states the verify never
    wrote over the checkpoints); a manager already checked is not checked again."""
    def manager(**kw):
        layer_cache = SimpleNamespace(intermediate_conv_window=torch.zeros(2, 3, 4, 3), has_kda_replay_caches=False)
        upstream_commit = lambda *a, **k: None  # noqa: E731
        fields = dict(enable_block_reuse=False, kv_connector_manager=None, is_speculative=lambda: True,
                      use_replay_state_update=False, mamba_layer_cache=lambda i: layer_cache,
                      update_mamba_states=upstream_commit)
        return SimpleNamespace(**{**fields, **kw}), upstream_commit

    model = Toy([1, 3])
    replay = ReplayModel.install(model, "ToyForCausalLM", "mamba2", {Upstream: Replay}, 6, torch.float32,
                                 spec_tokens=1)  # windows of two tokens
    estimation, _ = manager()
    serving, serving_commit = manager()
    for m in (estimation, estimation, serving, serving):
        assert replay.begin_step(SimpleNamespace(kv_cache_manager=m, beam_width=1))
        replay.end_step()
    for m in (estimation, serving):
        assert m.update_mamba_states.func == replay.cache.update_mamba_states and m.update_mamba_states.args == (m,)
    # checked once: a commit put back on a checked manager stays
    serving.update_mamba_states = serving_commit
    assert replay.begin_step(SimpleNamespace(kv_cache_manager=serving, beam_width=1))
    replay.end_step()
    assert serving.update_mamba_states is serving_commit
    # a serving manager that shows what replay cannot serve: the model falls back as a whole, that manager untouched
    caplog.set_level(logging.WARNING, "trtllm_replayssm")
    refused, refused_commit = manager(use_replay_state_update=True)
    assert not replay.begin_step(SimpleNamespace(kv_cache_manager=refused, beam_width=1))
    assert refused.update_mamba_states is refused_commit and all(type(m) is Upstream for m in model.layers[:2])
    assert any("use_replay_state_update" in r.getMessage() for r in caplog.records)


def test_no_matching_mixer_or_no_hook_point_is_an_error():
    with pytest.raises(RuntimeError, match="has no Upstream layer"):
        _install(torch.nn.Sequential(torch.nn.Linear(2, 2)))
    model = Toy([1, -1])
    with pytest.raises(RuntimeError, match="layer_idx is negative"):
        _install(model)
    assert all(type(m) is Upstream for m in model.layers[:2])  # nothing swapped
    model.layers[1].layer_idx = None
    with pytest.raises(RuntimeError, match="Upstream has no integer layer_idx"):
        _install(model)


def test_refusals_from_llm_args():
    ok = SimpleNamespace(kv_cache_config=SimpleNamespace(use_kv_cache_manager_v2="auto"),
                         cache_transceiver_config=None, kv_connector_config=None, max_beam_width=1,
                         speculative_config=None)
    assert refusals_from_llm_args(ok) == []
    bad = SimpleNamespace(kv_cache_config=SimpleNamespace(use_kv_cache_manager_v2=True),
                          cache_transceiver_config=object(), kv_connector_config=object(), max_beam_width=4,
                          torch_compile_config=object(),
                          speculative_config=object())  # speculative decoding: speculative_refusals decides
    reasons = refusals_from_llm_args(bad)
    assert len(reasons) == 5
    for key in ("use_kv_cache_manager_v2", "cache_transceiver_config", "kv_connector_config", "max_beam_width",
                "torch_compile_config"):
        assert sum(key in r for r in reasons) == 1, key


def test_speculative_refusals(monkeypatch):
    monkeypatch.delenv(MTP_CUSTOM_OP_ENV, raising=False)
    mtp = SimpleNamespace(decoding_type="MTP", max_draft_len=3, max_total_draft_tokens=3, draft_len_schedule=None)
    assert speculative_refusals("mamba2", None, None, True) == []  # nothing configured, nothing refused
    assert speculative_refusals("mamba2", mtp, 3, False) == []
    assert speculative_refusals("mamba2", SimpleNamespace(num_nextn_predict_layers=3), 3, False) == []
    assert speculative_refusals("gdn", mtp, 3, False) == speculative_refusals("kda", mtp, 3, False) == []
    cases = [("mamba2", SimpleNamespace(decoding_type="Eagle3", max_draft_len=3), 3, False, "MTP windows only"),
             ("mamba2", SimpleNamespace(max_draft_len=3, max_total_draft_tokens=9), 3, False, "a tree"),
             ("mamba2", mtp, None, False, "without --spec-tokens: rebuild it with --spec-tokens 3"),
             ("mamba2", mtp, 2, False, "sized for 2: rebuild it with --spec-tokens 3"),
             ("mamba2", mtp, 3, True, "plain fp32/fp16/bf16 checkpoints"),
             ("gdn", SimpleNamespace(max_draft_len=3, draft_len_schedule={1: 3, 8: 0}), 3, False, "draft_len_schedule")]
    for family, config, bundle, stored, match in cases:
        reasons = speculative_refusals(family, config, bundle, stored)
        assert len(reasons) == 1 and match in reasons[0], (match, reasons)
    monkeypatch.setenv(MTP_CUSTOM_OP_ENV, "1")
    assert MTP_CUSTOM_OP_ENV in speculative_refusals("mamba2", mtp, 3, False)[0]
    assert speculative_refusals("gdn", mtp, 3, False) == []  # Mamba2Mixer's custom op only


def test_refusals_from_quant_config():
    assert refusals_from_quant_config(None) == refusals_from_quant_config(SimpleNamespace()) == []
    assert refusals_from_quant_config(SimpleNamespace(mamba_ssm_stochastic_rounding=False)) == []
    # with or without speculative decoding: upstream's seeded SSU would round the lagging checkpoint in place
    (reason,) = refusals_from_quant_config(SimpleNamespace(mamba_ssm_stochastic_rounding=True))
    assert "mamba_ssm_stochastic_rounding" in reason and "--stochastic-rounding" in reason


def test_refusals_from_cache_manager():
    class MambaHybridCacheManagerV2:
        enable_block_reuse = False
        kv_connector_manager = None

    ok = SimpleNamespace(enable_block_reuse=False, kv_connector_manager=None, is_speculative=lambda: False)
    assert refusals_from_cache_manager(ok, 1) == []
    assert len(refusals_from_cache_manager(MambaHybridCacheManagerV2(), 1)) == 1
    bad = SimpleNamespace(enable_block_reuse=True, kv_connector_manager=object(), is_speculative=lambda: True)
    assert len(refusals_from_cache_manager(bad, 2)) == 4
    spec_ok = SimpleNamespace(enable_block_reuse=False, kv_connector_manager=None, is_speculative=lambda: True,
                              use_replay_state_update=False, mamba_layer_cache=lambda i: None,
                              update_mamba_states=lambda *a, **k: None)
    assert refusals_from_cache_manager(spec_ok, 1, speculative=True) == []
    del spec_ok.use_replay_state_update  # a manager without TensorRT-LLM's MTP replay at all
    assert refusals_from_cache_manager(spec_ok, 1, speculative=True) == []
    assert len(refusals_from_cache_manager(spec_ok, 1)) == 1  # a speculative manager, no served speculation
    spec_bad = SimpleNamespace(enable_block_reuse=False, kv_connector_manager=None, is_speculative=lambda: False,
                               use_replay_state_update=True)
    reasons = refusals_from_cache_manager(spec_bad, 1, speculative=True)
    assert len(reasons) == 3 and "use_replay_state_update" in reasons[1] and "mamba_layer_cache" in reasons[2]
    # the commit copies conv windows from the layer cache's per-draft buffer
    windows = SimpleNamespace(intermediate_conv_window=torch.zeros(2, 3, 4, 3), has_kda_replay_caches=False)
    assert refusals_from_cache_manager(spec_ok, 1, speculative=True, layer_cache=windows) == []
    kda_replay = SimpleNamespace(intermediate_conv_window=None, has_kda_replay_caches=True)
    (reason,) = refusals_from_cache_manager(spec_ok, 1, speculative=True, layer_cache=kda_replay)
    assert "KDA replay caches" in reason
    (reason,) = refusals_from_cache_manager(spec_ok, 1, speculative=True,
                                            layer_cache=SimpleNamespace(intermediate_conv_window=None))
    assert "no intermediate_conv_window" in reason


def test_checkpointless_cache_factories():
    cache = ReplayStateCache.gdn(2, 5, 2, 4, 64, 16, buffer_len=4, checkpoints=False, device="cpu")
    assert cache.layer(0).state is None and cache.state_shape == (4, 16, 64)
    layer = cache.with_checkpoint(1, torch.zeros(5, 4, 16, 64))
    assert layer.u_ring is cache.layer(1).u_ring and layer.state.shape == (5, 4, 16, 64)


def test_rings_beyond_the_bundle_plan_are_reported(caplog):
    caplog.set_level(logging.INFO, "trtllm_replayssm")
    pool = _unified(blocks=9)
    per_slot = ModelReplayCache("mamba2", [2, 5, 7], 2, 4, torch.bfloat16)
    per_slot.layer(2, pool.get_ssm_states(2))
    planned_for_5 = per_slot.cache.bytes_per_slot() * 5
    cache = ModelReplayCache("mamba2", [2, 5, 7], 2, 4, torch.bfloat16, planned=(planned_for_5, 5))
    cache.layer(2, pool.get_ssm_states(2))
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "has 9 slots, the bundle planned the rings for 5" in warnings[0]
    assert "--max-batch-size 8" in warnings[0]


def test_settings_from_a_bundle_manifest(tmp_path, monkeypatch):
    from trtllm_replayssm.serving.bundle import manifest_dict
    from trtllm_replayssm.serving.memory_plan import plan
    from trtllm_replayssm.serving.presets import get_preset
    from trtllm_replayssm.serving.trtllm import MANIFEST_ENV, load_settings, settings_from_env

    spec = get_preset("qwen3.5-4b")
    mp = plan(spec, "h200", buffer_len=8, max_batch_size=64)
    path = tmp_path / "manifest.json"
    path.write_text(__import__("json").dumps(manifest_dict(spec, mp, "sm_90a", [], None)))
    settings = load_settings(path)
    assert (settings.family, settings.buffer_len, settings.act_dtype) == ("gdn", 8, "bf16")
    assert (settings.planned_ring_bytes, settings.planned_slots) == (mp.ring_bytes_per_gpu, 65)
    assert settings.spec_tokens is None  # built without --spec-tokens
    monkeypatch.delenv(MANIFEST_ENV, raising=False)
    with pytest.raises(RuntimeError, match="TRTLLM_REPLAYSSM_MANIFEST is not set"):
        settings_from_env()
    monkeypatch.setenv(MANIFEST_ENV, str(path))
    assert settings_from_env() == settings
    with pytest.raises(ValueError, match="manifest_path: cannot read"):
        load_settings(tmp_path / "missing.json")


def _served_layer(family):
    """(cache, layer, state shape) of a small fp32 layer of ``family`` on a unified pool, as the module binds it."""
    _, shape, k_heads, _ = _served_geometry(family)
    pool = UnifiedPool([2], 300, shape, torch.float32, conv_bytes=3 * 16 * 8, device="cpu")
    cache = ModelReplayCache(family, [2], num_k_heads=k_heads, buffer_len=4, act_dtype=torch.bfloat16)
    return cache, cache.layer(2, pool.get_ssm_states(2)), shape


def _served_geometry(family):
    """(dims, state shape [heads, rows, cols], num_k_heads, a step generator) of a small layer of ``family``."""
    from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
    from trtllm_replayssm.core.samples import delta_step, mamba2_step

    if family == "mamba2":
        return Mamba2Dims(nheads=4, head_dim=16, d_state=32, n_groups=2), STATE, 2, mamba2_step
    if family == "gdn":
        return GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=16), (4, 16, 64), 2, delta_step
    return KDADims(num_heads=2, head_dim=64), (2, 64, 64), 2, delta_step


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("label", ["nvfp4/dual/fp16", "fp8/dual/fp32+sr"])
def test_dual_mode_the_pool_is_the_master_and_prefill_encodes_the_read_copy(family, label):
    """TensorRT-LLM's pool is the master; after upstream's prefill writes it, the quantized read copy follows, and
    decode steps (CPU references through the ops) equal a cache that stores both itself and got the same prefill."""
    from trtllm_replayssm.core.families import get_family
    from trtllm_replayssm.core.formats import parse_state_label

    spec = parse_state_label(label)
    dims, shape, k_heads, make_step = _served_geometry(family)
    fam = get_family(family)
    pool = UnifiedPool([2, 5], 6, shape, spec.checkpoint_format.storage_dtype, conv_bytes=3 * 16 * 8, device="cpu")
    cache = ModelReplayCache(family, [2, 5], num_k_heads=k_heads, buffer_len=4, act_dtype=torch.bfloat16, state=spec)
    own = fam.new_cache(dims, 2, 6, buffer_len=4, state_dtype=spec, device="cpu")
    gen = torch.Generator().manual_seed(3)
    ctx = torch.tensor([4, 1], dtype=torch.int32)
    cache.begin_step()
    for i, lid in enumerate((2, 5)):
        view = pool.get_ssm_states(lid)
        cache.layer_step(lid, view, ctx, num_contexts=2)
        prefill = torch.randn(2, *shape, generator=gen).to(view.dtype)
        view[ctx.long()] = prefill  # upstream's prefill writes the master
        cache.prefill_written(lid, view, ctx)
        own.load_prefill_state(i, ctx, prefill.float())
    cache.end_step()
    for i, lid in enumerate((2, 5)):
        served = cache.layer(lid, pool.get_ssm_states(lid)).checkpoint()
        assert torch.equal(served.read_values(ctx.long()), own.layer(i).checkpoint().read_values(ctx.long()))
    assert cache.cache.layer(0).state is None  # the master is the pool's, never copied
    for _ in range(6):  # across a flush (L = 4): the kernels' write rule on both sides
        args, kwargs = make_step(dims, 2, gen, "cpu").op_args()
        cache.begin_step()
        for i, lid in enumerate((2, 5)):
            view = pool.get_ssm_states(lid)
            layer = cache.layer_step(lid, view, ctx, num_contexts=0)
            y = fam.replay_decode(layer, *args, **kwargs, state_batch_indices=cache.decode_slots(ctx))
            y_own = fam.replay_decode(own.layer(i), *args, **kwargs, state_batch_indices=ctx)
            assert torch.equal(y, y_own)
        cache.end_step()
    for i, lid in enumerate((2, 5)):
        served = cache.layer(lid, pool.get_ssm_states(lid)).checkpoint()
        mine = own.layer(i).checkpoint()
        assert torch.equal(served.fold_values(ctx.long()), mine.fold_values(ctx.long()))
        assert torch.equal(served.read_values(ctx.long()), mine.read_values(ctx.long()))


@pytest.mark.parametrize("label", ["fp32", "nvfp4/dual/fp16", "fp8/dual/bf16+sr"])
def test_gdn_materialize_folds_like_a_flush(label):
    """A mixed batch's decode rows: the rings folded into the pool's master (float64 recurrence from the rings'
    records), the read copy (dual mode) rewritten from the fold too, the flush counted under stochastic rounding, the
    cursors at 0; the slot left out untouched."""
    from trtllm_replayssm.core.families import get_family
    from trtllm_replayssm.core.formats import parse_state_label
    from trtllm_replayssm.serving.trtllm.core import gdn_materialize_slots

    spec = parse_state_label(label)
    dims, shape, k_heads, make_step = _served_geometry("gdn")
    pool = UnifiedPool([3], 5, shape, spec.checkpoint_format.storage_dtype, conv_bytes=64, device="cpu")
    cache = ModelReplayCache("gdn", [3], num_k_heads=k_heads, buffer_len=4, act_dtype=torch.float32, state=spec)
    gen = torch.Generator().manual_seed(8)
    slots = torch.tensor([3, 0, 2], dtype=torch.int32)
    cache.begin_step()
    view = pool.get_ssm_states(3)
    cache.layer_step(3, view, slots, num_contexts=3)
    view[slots.long()] = torch.randn(3, *shape, generator=gen).to(view.dtype)
    cache.prefill_written(3, view, slots)
    cache.end_step()
    for _ in range(3):  # three ring records per row, no flush (L = 4)
        args, kwargs = make_step(dims, 3, gen, "cpu", torch.float32).op_args()
        cache.begin_step()
        layer = cache.layer_step(3, pool.get_ssm_states(3), slots, num_contexts=0)
        get_family("gdn").replay_decode(layer, *args, **kwargs, state_batch_indices=cache.decode_slots(slots),
                                        mode="replay")
        cache.end_step()
    layer = cache.layer(3, pool.get_ssm_states(3))
    before = layer.checkpoint()
    kept = torch.tensor([2])
    untouched = before.fold_values(kept), before.read_values(kept)
    counts = None if before.flushes is None else before.flushes.clone()
    ids = torch.tensor([3, 0])
    stale = before.read_values(ids)  # the read copy before the fold (a decoded copy)
    want = []
    for slot in ids.tolist():  # S = e^{G_2} S0 + sum_j e^{G_2 - G_j} u_j k_jᵀ
        s = before.fold_values(torch.tensor([slot]))[0].double()
        g = layer.g_ring[slot, :, :3].double()
        u = layer.u_ring[slot, :, :3].double()
        k = layer.k_ring[slot, :, :3].double().repeat_interleave(dims.heads // dims.key_heads, dim=0)
        s = torch.exp(g[:, 2])[:, None, None] * s + torch.einsum("hl,hlv,hlk->hvk", torch.exp(g[:, 2:3] - g), u, k)
        want.append(s)
    want = torch.stack(want)
    gdn_materialize_slots(layer, ids)
    after = layer.checkpoint()
    assert layer.cursor[ids].tolist() == [0, 0] and int(layer.cursor[2]) == 3
    master_tol = {"fp32": 1e-5, "fp16": 2e-3, "bf16": 1e-2}[spec.checkpoint_format.name]
    torch.testing.assert_close(after.fold_values(ids).double(), want, rtol=master_tol, atol=master_tol)
    if spec.dual:  # the read copy encodes the fold: within the format's rounding of each row's (block's) scale
        rows_max = want.abs().amax(-1, keepdim=True)
        assert ((after.read_values(ids).double() - want).abs() <= 0.2 * rows_max).all()
        assert not torch.equal(after.read_values(ids), stale)
    assert torch.equal(after.fold_values(kept), untouched[0]) and torch.equal(after.read_values(kept), untouched[1])
    if counts is not None:
        assert torch.equal(after.flushes[ids], counts[ids] + 1) and after.flushes[2] == counts[2]


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("label", ["nvfp4", "fp8+sr", "nvfp4/dual/fp8"])
def test_codes_live_in_the_pool_and_prefills_change_their_form(family, label):
    """An FP8/NVFP4 checkpoint (or FP8 master) keeps its codes in the bytes of a bf16 unified pool, its scales in
    our cache: a prefill's values are encoded into codes, a later chunk finds the decoded values where upstream reads
    them, decode steps equal a self-contained cache that got the same prefills, and no byte outside the written
    slots' state regions changes (other slots, other layers, conv states)."""
    from trtllm_replayssm.core.families import get_family
    from trtllm_replayssm.core.formats import parse_state_label

    spec = parse_state_label(label)
    dims, shape, k_heads, make_step = _served_geometry(family)
    fam = get_family(family)
    pool = UnifiedPool([2, 5], 6, shape, torch.bfloat16, conv_bytes=3 * 16 * 8, device="cpu")
    pool.pool.copy_(torch.randint(0, 256, pool.pool.shape, dtype=torch.uint8,  # every byte outside the written
                                  generator=torch.Generator().manual_seed(1)))  # regions is checked below
    cache = ModelReplayCache(family, [2, 5], num_k_heads=k_heads, buffer_len=4, act_dtype=torch.bfloat16, state=spec)
    own = fam.new_cache(dims, 2, 6, buffer_len=4, state_dtype=spec, device="cpu")
    gen = torch.Generator().manual_seed(3)
    ctx = torch.tensor([4, 1], dtype=torch.int32)

    def prefill(rows, check_exposed):
        cache.begin_step()
        for i, lid in enumerate((2, 5)):
            view = pool.get_ssm_states(lid)
            cache.layer_step(lid, view, rows, num_contexts=rows.numel())
            if check_exposed:  # a later chunk reads the checkpoint as values
                want = own.layer(i).checkpoint().fold_values(rows.long()).to(view.dtype)
                assert torch.equal(view[rows.long()], want)
            values = torch.randn(rows.numel(), *shape, generator=gen).to(view.dtype)
            view[rows.long()] = values  # upstream's prefill writes values over the codes
            cache.prefill_written(lid, view, rows)
            own.load_prefill_state(i, rows, values.float())
        cache.end_step()

    before = pool.pool.clone()
    prefill(ctx, check_exposed=False)
    prefill(ctx[:1], check_exposed=True)
    written = torch.zeros_like(pool.pool, dtype=torch.bool)
    written[:, ctx.long(), :pool.ssm_bytes] = True  # [layers, blocks, ssm bytes + conv bytes]
    assert torch.equal(pool.pool[~written], before[~written])
    assert all(cache.cache.layer(i).state is None for i in range(2))  # the codes are the pool's
    for _ in range(6):  # across a flush (L = 4): the write rule on both sides
        args, kwargs = make_step(dims, 2, gen, "cpu").op_args()
        cache.begin_step()
        for i, lid in enumerate((2, 5)):
            layer = cache.layer_step(lid, pool.get_ssm_states(lid), ctx, num_contexts=0)
            y = fam.replay_decode(layer, *args, **kwargs, state_batch_indices=cache.decode_slots(ctx))
            assert torch.equal(y, fam.replay_decode(own.layer(i), *args, **kwargs, state_batch_indices=ctx))
        cache.end_step()
    for i, lid in enumerate((2, 5)):
        served, mine = cache.layer(lid, pool.get_ssm_states(lid)).checkpoint(), own.layer(i).checkpoint()
        assert torch.equal(served.fold_values(ctx.long()), mine.fold_values(ctx.long()))
        assert torch.equal(served.read_values(ctx.long()), mine.read_values(ctx.long()))
        cache.begin_step()
        cache.expose_slots(lid, pool.get_ssm_states(lid), ctx)  # e.g. GDN's mixed-batch decode rows
        cache.end_step()
        assert torch.equal(pool.get_ssm_states(lid)[ctx.long()], mine.fold_values(ctx.long()).bfloat16())


def test_stored_state_refusals():
    from trtllm_replayssm.core.formats import parse_state_label

    args = ("mamba2", [2, 5], 2, 4, torch.bfloat16)
    cache = ModelReplayCache(*args, state=parse_state_label("fp8/dual/fp16"))
    with pytest.raises(RuntimeError, match="SSM pool is torch.float32, the bundle's fp8/dual/fp16 state needs its "
                                           "master in torch.float16"):
        cache.layer(2, _unified().get_ssm_states(2))
    cache = ModelReplayCache(*args, state=parse_state_label("nvfp4"))
    fp8_pool = UnifiedPool([2, 5, 7], 9, STATE, torch.float8_e4m3fn, conv_bytes=3 * 16 * 8, device="cpu")
    with pytest.raises(RuntimeError, match="the bundle's nvfp4 codes cannot live in TensorRT-LLM's SSM pool .*: "
                                           "state: expected an fp32/fp16/bf16 pool"):
        cache.layer(2, fp8_pool.get_ssm_states(2))


def test_speculative_cache_rings_and_refusals():
    pool = _unified()
    cache = ModelReplayCache("mamba2", [2, 5, 7], num_k_heads=2, buffer_len=6, act_dtype=torch.float32, spec_tokens=2)
    assert (cache.window, cache.ring_len) == (3, 9)
    assert cache.layer(2, pool.get_ssm_states(2)).x_ring.shape[2] == 9  # L + N + 1 records
    with pytest.raises(RuntimeError, match="commit without a verify"):
        cache.commit(torch.ones(1, dtype=torch.int32), torch.zeros(1, dtype=torch.int32))
    cache.begin_step()
    x = torch.zeros(1, 4, 4, 16)  # a window of 4 > 3 tokens
    with pytest.raises(ValueError, match=r"^step_args: expected windows of 1 to 3 tokens"):
        cache.verify(2, pool.get_ssm_states(2), torch.zeros(1, dtype=torch.int32), x, out=torch.empty(0))
    with pytest.raises(ValueError, match=r"^buffer_len: windows of 8 tokens need rings of 16 records, L \+ N \+ 1 = 12"):
        ModelReplayCache("mamba2", [2], num_k_heads=2, buffer_len=4, act_dtype=torch.float32, spec_tokens=7)
    with pytest.raises(ValueError, match=r"^state: speculative verify reads plain checkpoints"):
        ModelReplayCache("mamba2", [2], num_k_heads=2, buffer_len=6, act_dtype=torch.float32,
                         state=parse_state_label("fp8/dual/fp32"), spec_tokens=2)
    standard = ModelReplayCache("mamba2", [2], num_k_heads=2, buffer_len=4, act_dtype=torch.float32)
    standard.begin_step()
    with pytest.raises(RuntimeError, match="verify on a cache built without spec_tokens"):
        standard.verify(2, pool.get_ssm_states(2), torch.zeros(1, dtype=torch.int32), x, out=torch.empty(0))

