"""Argument contracts of the TensorRT-LLM-free serving core (serving/trtllm/core.py): batch split bounds, slot-id
mapping edges, refusal triggers and the KDA/GDN helpers' shape errors, each with its message."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace

import pytest
import torch

from trtllm_replayssm.core.dims import GDNDims, KDADims
from trtllm_replayssm.serving.trtllm import core


def test_split_batch_bounds():
    idx = torch.arange(5)
    s = core.split_batch(idx, 2, 5)
    assert (s.num_contexts, s.num_decodes) == (2, 3)
    assert s.prefill_slots.tolist() == [0, 1] and s.decode_slots.tolist() == [2, 3, 4]
    assert core.split_batch(idx, 0, 0).num_decodes == 0 and core.split_batch(idx, 3, 3).num_decodes == 0
    for nc, ns in ((3, 2), (-1, 2), (0, 6)):
        with pytest.raises(ValueError, match=rf"^num_contexts/num_seqs: expected 0 <= {nc} <= {ns} <= "
                                             r"len\(state_indices\)=5"):
            core.split_batch(idx, nc, ns)
    with pytest.raises(ValueError, match=r"^state_indices: expected a 1-D tensor, got shape \(5, 1\)"):
        core.split_batch(idx[:, None], 0, 1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.num_contexts = 0


def test_decode_slot_ids_edges():
    assert core.decode_slot_ids(torch.tensor([0, 0, 1]), num_slots=1).tolist() == [0, -1, -1]
    with pytest.raises(ValueError, match=r"^num_slots: expected a positive integer, got 0"):
        core.decode_slot_ids(torch.tensor([0]), num_slots=0)
    with pytest.raises(ValueError, match=r"^decode_slots: expected a 1-D tensor, got shape \(1, 2\)"):
        core.decode_slot_ids(torch.tensor([[0, 1]]), num_slots=2)
    assert core.decode_slot_ids(torch.tensor([3, 4, 2]), num_slots=4).tolist() == [3, -1, 2]


def test_per_head():
    A = torch.arange(3.0)[:, None, None].expand(3, 4, 5)
    assert core.per_head(A, 1, "A").tolist() == [0.0, 1.0, 2.0]
    same = torch.arange(3.0)
    assert core.per_head(same, 1, "A") is same
    assert core.per_head(None, 1, "D") is None
    assert core.per_head(torch.arange(3.0)[:, None], 1, "D").tolist() == [0.0, 1.0, 2.0]  # P = 1
    with pytest.raises(ValueError, match=r"^dt: expected at least 2 dims, got shape \(3,\)"):
        core.per_head(same, 2, "dt")


def test_refusal_triggers():
    assert core.refusals_from_llm_args(SimpleNamespace()) == []
    assert core.refusals_from_llm_args(SimpleNamespace(max_beam_width=1)) == []
    assert core.refusals_from_llm_args(SimpleNamespace(max_beam_width=None)) == []
    (beam,) = core.refusals_from_llm_args(SimpleNamespace(max_beam_width=2))
    assert beam.startswith("max_beam_width is 2: ")
    assert core.refusals_from_cache_manager(SimpleNamespace(), beam_width=1) == []
    (reuse,) = core.refusals_from_cache_manager(SimpleNamespace(enable_block_reuse=True), beam_width=1)
    assert reuse.startswith("kv_cache_config.enable_block_reuse is true")
    (beams,) = core.refusals_from_cache_manager(SimpleNamespace(), beam_width=2)
    assert beams.startswith("beam width 2: ")


def test_replay_disabled(monkeypatch):
    monkeypatch.delenv(core.DISABLE_ENV, raising=False)
    assert core.replay_disabled() is False
    monkeypatch.setenv(core.DISABLE_ENV, "0")
    assert core.replay_disabled() is False
    monkeypatch.setenv(core.DISABLE_ENV, "1")
    assert core.replay_disabled() is True


def test_kda_helper_shape_errors():
    w = torch.zeros(8, 1, 4)
    assert core.kda_packed_conv_weight(w, w, w).shape == (24, 4)
    assert core.kda_packed_conv_weight(w[:, 0], w[:, 0], w[:, 0]).shape == (24, 4)
    with pytest.raises(ValueError, match=r"^k_weight: expected shape \[D, 1, W\] or \[D, W\], got \(8, 2, 4\)"):
        core.kda_packed_conv_weight(w, torch.zeros(8, 2, 4), w)
    with pytest.raises(ValueError, match=r"^q_weight/k_weight/v_weight: expected equal shapes"):
        core.kda_packed_conv_weight(w, w, torch.zeros(6, 1, 4))
    g, beta = core.kda_gate_inputs(torch.zeros(3, 8), torch.zeros(3, 2), 2, 4)
    assert g.shape == (3, 2, 4) and beta.shape == (3, 2)
    with pytest.raises(ValueError, match=r"^g_hidden: expected shape \[tokens, 8\], got \(3, 6\)"):
        core.kda_gate_inputs(torch.zeros(3, 6), torch.zeros(3, 2), 2, 4)
    with pytest.raises(ValueError, match=r"^g_hidden: expected shape \[tokens, 8\], got \(3, 8, 1\)"):
        core.kda_gate_inputs(torch.zeros(3, 8, 1), torch.zeros(3, 2), 2, 4)
    with pytest.raises(ValueError, match=r"^beta: expected shape \[3, 2\], got \(3, 1\)"):
        core.kda_gate_inputs(torch.zeros(3, 8), torch.zeros(3, 1), 2, 4)
    a, b = core.kda_fp32_params(torch.zeros(2, dtype=torch.bfloat16), torch.zeros(8), 2, 4)
    assert a.dtype == torch.float32 and b.shape == (2, 4)
    with pytest.raises(ValueError, match=r"^A_log: expected 2 elements, got shape \(3,\)"):
        core.kda_fp32_params(torch.zeros(3), torch.zeros(8), 2, 4)
    with pytest.raises(ValueError, match=r"^dt_bias: expected 8 elements, got shape \(6,\)"):
        core.kda_fp32_params(torch.zeros(2), torch.zeros(6), 2, 4)
    with pytest.raises(ValueError, match=r"^conv_pool: expected shape \[slots, 24, 3\], got \(2, 24, 4\)"):
        core.kda_check_conv_pool(torch.zeros(2, 24, 4), 8, 4)
    core.kda_check_conv_pool(torch.zeros(2, 24, 3), 8, 4)
    with pytest.raises(ValueError, match=r"^mixed_qkv: expected shape \[\.\.\., 24\], got \(2, 20\)"):
        KDADims(num_heads=2, head_dim=4).split_qkv(torch.zeros(2, 20))
    with pytest.raises(ValueError, match=r"^mixed_qkv: expected shape \[\.\.\., 20\], got \(2, 16\)"):
        GDNDims(num_k_heads=1, num_v_heads=3, head_k_dim=4, head_v_dim=4).split_qkv(torch.zeros(2, 16))
