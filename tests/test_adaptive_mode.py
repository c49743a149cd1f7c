"""CPU: launch policy: the adaptive mode (which steps flush every step instead of replaying), the fold buffer, the
persistent kernels' claimed tail, the prep kernels' programmatic launch."""
import pytest
import torch

from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.ops import launch as _launch
from trtllm_replayssm.core.ops import gdn as gdn_ops
from trtllm_replayssm.core.ops.launch import force_flush_for

CUDA = torch.device("cuda", 0)  # only the device type is read when the threshold comes from the environment


def test_explicit_modes_win():
    assert force_flush_for("gdn", "flush", 512, 64, torch.float32, CUDA)
    assert not force_flush_for("gdn", "replay", 1, 1, torch.bfloat16, CUDA)
    assert not force_flush_for("mamba2", "auto", 1, 1, torch.float32, torch.device("cpu"))  # CPU: the reference


def test_auto_threshold_and_state_dtype(monkeypatch):
    monkeypatch.setenv("TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD", "1000")
    monkeypatch.setattr(_launch, "replay_capable", lambda device: True)
    assert force_flush_for("mamba2", "auto", 10, 96, torch.float32, CUDA)        # 960 work items < 1000
    assert not force_flush_for("mamba2", "auto", 11, 96, torch.float32, CUDA)
    assert not force_flush_for("mamba2", "auto", 11, 96, torch.bfloat16, CUDA)
    assert not force_flush_for("gdn", "auto", 64, 32, torch.float32, CUDA)
    assert not force_flush_for("gdn", "auto", 64, 32, torch.bfloat16, CUDA)      # bf16: measured faster from 64
    assert force_flush_for("kda", "auto", 512, 64, torch.float16, CUDA)          # GDN/KDA fp16: not measured


def test_default_threshold_is_8_work_items_per_sm(monkeypatch):
    """Measured on the H200 (run 6): replay loses at batch 8 and wins at batch 64 for every benchmark shape."""
    monkeypatch.delenv("TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD", raising=False)
    monkeypatch.setattr(_launch, "replay_capable", lambda device: True)
    monkeypatch.setattr(_launch, "sm_count", lambda index: 132)
    for family, heads in (("mamba2", 96), ("gdn", 32), ("kda", 32)):
        assert force_flush_for(family, "auto", 8, heads, torch.float32, CUDA)
        assert not force_flush_for(family, "auto", 64, heads, torch.float32, CUDA)


def test_fold_buffer_only_where_it_costs_no_stage(monkeypatch):
    """persistent_plan keeps the fold buffer only if the CTA keeps its number of stages, or, fold_first (KDA), while
    3 stages remain; GDN/KDA row tiles."""
    from trtllm_replayssm.core.ops import gdn

    monkeypatch.setattr(_launch, "sm_count", lambda index: 132)
    fold = gdn.fold_bytes(16, 128, 2, per_channel_gate=True)
    assert fold == 16 * 128 * 2  # KDA: pre-decayed keys only, no gates
    assert gdn.fold_bytes(16, 128, gdn.key_ring_elem(torch.float16, True), per_channel_gate=True) == 16 * 128 * 4
    assert gdn.fold_bytes(16, 128, 2, per_channel_gate=False) == 16 * 128 * 2 + 16 * 4
    small, large = gdn.stage_bytes(16, 32, 128, 4, 2, True), gdn.stage_bytes(16, 64, 128, 4, 2, True)
    assert _launch.persistent_plan(small, 10_000, CUDA, fold) == (3 * 132, 4, 0)  # the buffer would cost a stage
    assert _launch.persistent_plan(small, 10_000, CUDA, fold, fold_first=True) == (3 * 132, 3, fold)
    assert _launch.persistent_plan(large, 10_000, CUDA, fold, fold_first=True) == (3 * 132, 2, 0)  # 1 stage left
    gdn_fold = gdn.fold_bytes(16, 128, 2, per_channel_gate=False)
    gdn_stage = gdn.stage_bytes(16, 64, 128, 4, 2, False)
    assert _launch.persistent_plan(gdn_stage, 10_000, CUDA, gdn_fold) == (3 * 132, 2, gdn_fold)
    monkeypatch.setattr(_launch, "FOLD_BUFFER_ENABLED", False)
    assert _launch.persistent_plan(small, 10_000, CUDA, fold, fold_first=True) == (3 * 132, 4, 0)
    # fp32 K = V = 128, launch heuristic 64 rows: KDA takes the largest tile that keeps its fold buffer with 3 stages,
    # GDN the largest
    assert gdn._fitting_tile(128, 128, 16, 4, 2, 64, True, 3, 2) == 32
    assert gdn._fitting_tile(128, 128, 16, 4, 2, 64, False, 3, 2) == 64
    assert gdn._fitting_tile(128, 128, 16, 2, 2, 64, True, 3, 2) == 64  # bf16 state: the buffer fits at 64 rows


def test_pre_hopper_gpus_flush(monkeypatch):
    """The persistent replay kernels need sm_90+: auto mode flushes on older GPUs at any batch."""
    monkeypatch.setenv("TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD", "1")
    monkeypatch.setattr(_launch, "replay_capable", lambda device: False)
    assert force_flush_for("mamba2", "auto", 512, 128, torch.float32, CUDA)
    assert not force_flush_for("mamba2", "replay", 512, 128, torch.float32, CUDA)  # the op then raises


def test_unknown_family_is_an_error(monkeypatch):
    monkeypatch.delenv("TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD", raising=False)
    with pytest.raises(KeyError):
        force_flush_for("rwkv", "auto", 1, 1, torch.float32, CUDA)


def test_tail_start_claims_whole_waves_after_the_first():
    """The claimed tail: none for fraction None; else the round-robin share rounded down to whole waves of `grid`
    tiles, never less than one wave and never past the last tile."""
    assert _launch.tail_start(1000, 100, None) == 1000
    assert _launch.tail_start(1000, 100, 0.1) == 900
    assert _launch.tail_start(1050, 100, 0.1) == 900  # 945 round-robin tiles -> 9 whole waves
    assert _launch.tail_start(1000, 100, 0.0) == 1000
    assert _launch.tail_start(1050, 100, 0.0) == 1000  # the last partial wave is claimed
    assert _launch.tail_start(1000, 100, 1.0) == 100  # the first wave stays round-robin
    assert _launch.tail_start(80, 100, 0.5) == 80  # one partial wave: nothing to claim


def test_step_scratch_keeps_the_claim_counter_before_the_rows():
    """The kernels address the claim counter as step[-1] of the rows they are given."""
    cache = ReplayStateCache.gdn(1, 5, 2, 4, 64, 64, buffer_len=4, device="cpu")
    step = cache.layer(0).step
    assert step.shape == (6,)
    assert _launch.step_rows(step) == step.data_ptr() + step.element_size()
    assert _launch.step_rows(None) == 0


def test_delta_rule_tail_claims_only_for_4_byte_states(monkeypatch):
    """GDN/KDA: fp32 states claim TAIL_FRACTION of the tiles; 16-bit states keep the round-robin schedule (their
    kernels compile without claims, plugins/delta_rule_decode.cu kTailClaims)."""
    monkeypatch.setattr(gdn_ops, "TAIL_FRACTION", 0.25)
    assert gdn_ops.tail_fraction(torch.float32) == 0.25
    assert gdn_ops.tail_fraction(torch.bfloat16) is None
    assert gdn_ops.tail_fraction(torch.float16) is None


@pytest.mark.parametrize("env,expected", [(None, True), ("0", False), ("1", True)])
def test_prep_launch_programmatic_by_default_env_override(env, expected, monkeypatch):
    """Prep kernels launch as programmatic dependents unless TRTLLM_REPLAYSSM_PREP_PDL=0."""
    if env is None:
        monkeypatch.delenv("TRTLLM_REPLAYSSM_PREP_PDL", raising=False)
    else:
        monkeypatch.setenv("TRTLLM_REPLAYSSM_PREP_PDL", env)
    seen = []
    monkeypatch.setattr(_launch, "launch", lambda *args, programmatic=False, **kw: seen.append(programmatic))
    _launch.launch_prep(object(), (1, 1, 1), (32, 1, 1), None)
    assert seen == [expected]


def test_prep_launch_env_rejects_other_values(monkeypatch):
    monkeypatch.setenv("TRTLLM_REPLAYSSM_PREP_PDL", "yes")
    with pytest.raises(ValueError, match="TRTLLM_REPLAYSSM_PREP_PDL"):
        _launch.prep_programmatic()
