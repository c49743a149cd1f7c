"""Memory plan and byte model: hand-computed bytes and the published ReplaySSM byte-model numbers."""
import pytest

from trtllm_replayssm.core import byte_model
from trtllm_replayssm.serving.memory_plan import check_tp, layer_bytes, local_dims, plan
from trtllm_replayssm.serving.presets import get_preset

MIB = 2**20


@pytest.mark.parametrize("name,state,speedup", [
    ("nemotron-3-super-120b", "fp32", 1.81), ("nemotron-3-super-120b", "bf16", 1.74),
    ("qwen3.5-4b", "fp32", 1.79), ("qwen3.5-122b", "fp32", 1.80), ("nemotron-3-nano-4b", "fp32", 1.81),
])
def test_speedup_matches_published_byte_model(name, state, speedup):
    assert plan(get_preset(name), "h200", state_dtype=state).step.speedup == pytest.approx(speedup, abs=0.006)


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
    with pytest.raises(ValueError, match="state_dtype"):
        plan(spec, "h100", state_dtype="fp8")
    with pytest.raises(ValueError, match="max_batch_size: rings"):
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
