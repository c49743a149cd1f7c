"""Memory plan and byte model: hand-computed bytes and the published ReplaySSM byte-model numbers."""
import dataclasses

import pytest

from trtllm_replayssm.core import byte_model
from trtllm_replayssm.core.formats import state_spec
from trtllm_replayssm.serving.memory_plan import check_tp, layer_bytes, local_dims, plan
from trtllm_replayssm.serving.presets import get_preset

MIB = 2**20
GIB = 2**30


@pytest.mark.parametrize("name,state,speedup", [
    ("nemotron-3-super-120b", "fp32", 1.81), ("nemotron-3-super-120b", "bf16", 1.74),
    ("qwen3.5-4b", "fp32", 1.79), ("qwen3.5-122b", "fp32", 1.80), ("nemotron-3-nano-4b", "fp32", 1.81),
])
def test_speedup_matches_published_byte_model(name, state, speedup):
    assert plan(get_preset(name), "h200", state=state).step.speedup == pytest.approx(speedup, abs=0.006)


def test_super_bytes_per_step():
    p = plan(get_preset("nemotron-3-super-120b"), "b200")
    assert p.layer.checkpoint == 4 * MIB
    # by hand: io = x + y (128*64*2 each) + B, C (2*8*128*2) + dt (128*4 fp32) + slot index 4
    io, rec, S = 2 * 16384 + 4096 + 512 + 4, 16384 + 2048 + 512, 4 * MIB
    assert p.layer.record == rec
    assert p.step.baseline == 2 * S + io == 8425988
    assert p.step.replay == pytest.approx(S + 7.5 * rec + rec * 15 / 16 + S / 16 + io) and int(p.step.replay) == 4653668
    # the published table (8.05 / 4.46 MiB) also counts z: within 0.5%
    assert p.step.baseline / MIB == pytest.approx(8.05, rel=0.005)
    assert p.step.replay / MIB == pytest.approx(4.46, rel=0.005)
    assert p.layer.ring / p.layer.checkpoint == pytest.approx(0.072, abs=0.001)


def test_buffer_len_one_equals_baseline():
    pred = byte_model.step_bytes(local_dims(get_preset("qwen3.5-4b"), 1), "fp32", "bf16", 1)
    assert pred.replay == pred.baseline


def test_tp_divides_local_heads():
    lb = layer_bytes(get_preset("nemotron-3-super-120b"), 4, 16, "fp32")
    assert lb.local_heads == {"nheads": 32, "n_groups": 2}
    assert lb.checkpoint == MIB
    check_tp(get_preset("nemotron-3-super-120b"), 8)  # 2 KV heads are replicated at TP 8


def test_tp_checks():
    with pytest.raises(ValueError, match="tp_size: 3 does not divide n_groups=8"):
        check_tp(get_preset("nemotron-3-nano-4b"), 3)
    with pytest.raises(ValueError, match="tp_size: expected a positive integer"):
        check_tp(get_preset("nemotron-3-nano-4b"), 0)


def test_per_sequence_totals_and_capacity():
    p = plan(get_preset("nemotron-3-super-120b"), "h100", max_batch_size=64)
    # upstream total = 40 layers x (4 MiB state + 60 KiB conv), the published figure is 162 MiB
    assert p.per_seq_upstream / MIB == pytest.approx(162.3, abs=0.1)
    assert p.per_seq_replay > p.per_seq_upstream
    assert p.max_seqs_replay < p.max_seqs_upstream
    assert p.ring_bytes_per_gpu == 40 * (p.layer.ring + p.layer.cursors) * 65
    assert 0.05 < p.free_gpu_memory_fraction < 0.9


def test_bad_inputs():
    spec = get_preset("qwen3.5-4b")
    with pytest.raises(ValueError, match="gpu: unknown GPU 'a100'"):
        plan(spec, "a100")
    with pytest.raises(ValueError, match="buffer_len: expected an integer"):
        plan(spec, "h100", buffer_len=0)
    with pytest.raises(ValueError, match="^state_format: unknown state format 'fp9'"):
        plan(spec, "h100", state="fp9")
    with pytest.raises(ValueError, match=r"^max_batch_size: our cache \(rings\) of 100000 sequences needs"):
        plan(spec, "h100", max_batch_size=100000, gpu_memory_gib=10)


def test_only_kv_heads_may_be_replicated():
    # TP 16 is a multiple of Super's 8 groups, but groups are split, never replicated (unlike KV heads)
    with pytest.raises(ValueError, match="tp_size: 16 does not divide n_groups=8"):
        check_tp(get_preset("nemotron-3-super-120b"), 16)
    with pytest.raises(ValueError, match="tp_size: 3 does not divide"):
        local_dims(get_preset("qwen3.5-4b"), 3)


def test_plan_defaults_and_rounding():
    spec = get_preset("qwen3.5-4b")
    p = plan(spec, "h200")
    assert p.max_batch_size == 256 and p.buffer_len == 16 and p.tp_size == 1 and p.act_dtype == "bf16"
    exact = 0.9 - p.ring_bytes_per_gpu / (0.5 * p.gpu_memory_bytes)
    assert p.free_gpu_memory_fraction == round(exact, 3) != round(exact, 4)
    with pytest.raises(ValueError, match=r"^gpu_memory_gib: expected a positive number, got 0"):
        plan(spec, "h200", gpu_memory_gib=0)
    with pytest.raises(ValueError, match=r"^gpu_memory_gib: expected a positive number, got True"):
        plan(spec, "h200", gpu_memory_gib=True)
    with pytest.raises(ValueError, match=r"^max_batch_size: expected a positive integer, got True"):
        plan(spec, "h200", max_batch_size=True)
    with pytest.raises(AttributeError):
        p.max_batch_size = 3  # plans are frozen
    with pytest.raises(AttributeError):
        p.layer.ring = 3


def test_local_dims_checks_attention_heads_too():
    import dataclasses
    spec = get_preset("qwen3.5-4b")
    odd = dataclasses.replace(spec, attention=dataclasses.replace(spec.attention, num_heads=12))
    with pytest.raises(ValueError, match=r"^tp_size: 8 does not divide num_attention_heads=12 of qwen3.5-4b"):
        local_dims(odd, 8)


# ---------------------------------------------------------------------------------------------------- state specs
# By hand, TP 1, L = 16, bf16 activations. A state row has 128 columns (Mamba-2 d_state, GDN head_k_dim) and takes
# fp32 512 B, fp16 256 B, fp8 128 + 4 B (fp32 row scale), nvfp4 64 + 8 + 4 B (an E4M3 scale per 16 elements and an
# fp32 second-level scale per row).
ROW = {"fp32": 512, "fp16": 256, "bf16": 256, "fp8": 132, "nvfp4": 76}
HAND = {
    # Nemotron-3-Nano-4B (Mamba-2): 96 heads x 80 rows, 8 groups; 21 SSM layers; conv over x, B, C (kernel 4)
    "nemotron-3-nano-4b": dict(rows=96 * 80, layers=21, record=96 * 80 * 2 + 8 * 128 * 2 + 96 * 4,
                               conv=3 * (96 * 80 + 2 * 8 * 128) * 2,
                               io=2 * 96 * 80 * 2 + 2 * 8 * 128 * 2 + 96 * 4 + 4),
    # Qwen3.5-4B (GDN): 32 value heads x 128 rows, 16 key heads; 24 SSM layers; conv over q, k, v
    "qwen3.5-4b": dict(rows=32 * 128, layers=24, record=32 * 128 * 2 + 16 * 128 * 2 + 32 * 4,
                       conv=3 * (2 * 16 * 128 + 32 * 128) * 2,
                       io=2 * 32 * 128 * 2 + 2 * 16 * 128 * 2 + 2 * 32 * 2 + 4),
}
# (spec, TensorRT-LLM pool dtype, what the pool holds, our state row bytes, checkpoint row bytes); the presets'
# state dtype is fp32. Codes in the pool leave us their scales: FP8 4 bytes a row, NVFP4 128 / 16 + 4.
CASES = {
    "nvfp4-dual-fp16": (state_spec("nvfp4", "dual", "fp16"), "fp16", "master", ROW["nvfp4"],
                        ROW["fp16"] + ROW["nvfp4"]),
    "fp8-shared": (state_spec("fp8", "shared"), "bf16", "codes", 4, ROW["fp8"]),
    "nvfp4-shared": (state_spec("nvfp4", "shared"), "bf16", "codes", 12, ROW["nvfp4"]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("model", sorted(HAND))
def test_state_spec_plan_by_hand(model, case):
    h, (st, pool, holds, our_row, checkpoint_row) = HAND[model], CASES[case]
    upstream, ours, ring = h["rows"] * ROW[pool], h["rows"] * our_row, 16 * h["record"]
    p = plan(get_preset(model), "h200", state=st, max_batch_size=128, gpu_memory_gib=141)
    lb = p.layer
    assert (lb.upstream_state, lb.our_state, lb.ring, lb.cursors, lb.conv) == (upstream, ours, ring, 8, h["conv"])
    assert lb.checkpoint == h["rows"] * checkpoint_row
    assert (p.state, p.pool_dtype, p.pool_holds) == (st, pool, holds)
    per_replay = h["layers"] * (upstream + ours + ring + 8 + h["conv"])
    per_upstream = h["layers"] * (upstream + h["conv"])
    assert (p.per_seq_replay, p.per_seq_upstream) == (per_replay, per_upstream)
    mem = 141 * GIB
    assert (p.max_seqs_replay, p.max_seqs_upstream) == (mem // per_replay, mem // per_upstream)
    assert p.max_seqs_replay < p.max_seqs_upstream
    assert p.ring_bytes_per_gpu == h["layers"] * (ring + 8) * 129  # what the TensorRT-LLM module checks
    assert p.reserve_bytes_per_gpu == h["layers"] * (ring + 8 + ours) * 129
    assert p.free_gpu_memory_fraction == round(0.9 - p.reserve_bytes_per_gpu / (0.5 * mem), 3)


@pytest.mark.parametrize("model", sorted(HAND))
def test_state_spec_step_bytes_by_hand(model):
    h = HAND[model]
    rec, io = h["record"], h["io"]
    ring = rec * 15 / 2 + rec * 15 / 16  # mean read of w = 0..15 entries, plus 15 appends per 16 steps
    master, read = h["rows"] * ROW["fp16"], h["rows"] * ROW["nvfp4"]
    dual = plan(get_preset(model), "h200", state=state_spec("nvfp4", "dual", "fp16")).step
    assert dual.baseline == 2 * master + io
    assert dual.replay == pytest.approx((15 * read + 2 * master + read) / 16 + ring + io)
    s8 = h["rows"] * ROW["fp8"]
    shared = plan(get_preset(model), "h200", state="fp8").step
    assert shared.baseline == 2 * s8 + io
    assert shared.replay == pytest.approx(s8 * 17 / 16 + ring + io)


def test_codes_in_a_bf16_pool_whatever_the_models_state_dtype():
    for dtype in ("fp32", "bf16"):
        spec = dataclasses.replace(get_preset("qwen3.5-4b"), ssm_state_dtype=dtype)
        for st in ("fp32", "bf16", state_spec("nvfp4", "dual", "bf16"), state_spec("fp8", "dual", "fp32", True)):
            assert plan(spec, "h200", state=st).trtllm_note is None
        for st, share in (("fp8", "50%"), ("nvfp4", "25%")):
            p = plan(spec, "h200", state=st)
            assert (p.pool_holds, p.pool_dtype, p.layer.upstream_state) == ("codes", "bf16", 32 * 128 * ROW["bf16"])
            assert f"holds the {st} codes in the first {share} of each slot's bytes" in p.trtllm_note
        fp8_master = plan(spec, "h200", state=state_spec("nvfp4", "dual", "fp8"))
        assert (fp8_master.pool_holds, fp8_master.layer.upstream_state) == ("codes", 32 * 128 * ROW["bf16"])
        assert fp8_master.layer.our_state == 32 * 128 * (4 + ROW["nvfp4"])
        assert "and the nvfp4 read copy" in fp8_master.trtllm_note


def test_plain_state_is_upstreams_pool():
    lb = layer_bytes(get_preset("nemotron-3-nano-4b"), 1, 16, "fp16")
    assert lb.upstream_state == lb.checkpoint == 96 * 80 * ROW["fp16"] and lb.our_state == 0
    assert lb.replay_total == lb.checkpoint + lb.ring + lb.cursors + lb.conv
    assert layer_bytes(get_preset("nemotron-3-nano-4b"), 1, 16, state_spec("fp16")) == lb


def test_stochastic_rounding_adds_the_flush_count_to_our_state():
    spec = get_preset("qwen3.5-4b")
    lb = layer_bytes(spec, 1, 16, state_spec("bf16", stochastic_rounding=True))
    assert (lb.upstream_state, lb.our_state, lb.checkpoint) == (32 * 128 * 256, 4, 32 * 128 * 256 + 4)
    lb = layer_bytes(spec, 1, 16, state_spec("nvfp4", "dual", "fp16", True))
    assert (lb.upstream_state, lb.our_state) == (32 * 128 * 256, 32 * 128 * 76 + 4)
