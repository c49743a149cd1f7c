"""CPU: the adaptive-mode policy (which steps flush every step instead of replaying)."""
import pytest
import torch

from trtllm_replayssm.ops import _launch
from trtllm_replayssm.ops._launch import force_flush_for

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
    assert force_flush_for("gdn", "auto", 64, 32, torch.bfloat16, CUDA)          # GDN/KDA 16-bit: not faster yet
    assert force_flush_for("kda", "auto", 512, 64, torch.float16, CUDA)


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
