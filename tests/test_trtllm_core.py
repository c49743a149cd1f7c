"""TensorRT-LLM metadata mapping and slot lifecycle (core functions; no TensorRT-LLM needed)."""
import pytest
import torch

from trtllm_replayssm.trtllm_core import (PAD_SLOT_ID, bind_layer_cache, check_trtllm_version, decode_slot_ids,
                                          gdn_materialize_slots, gdn_split_qkv, is_single_token_decode, per_head,
                                          prefill_handoff, split_batch)


def test_split_batch_contexts_first():
    idx = torch.tensor([5, 2, 7, 1, 9, 9], dtype=torch.int32)
    s = split_batch(idx, num_contexts=2, num_seqs=5)
    assert s.prefill_slots.tolist() == [5, 2] and s.decode_slots.tolist() == [7, 1, 9]
    assert (s.num_contexts, s.num_decodes) == (2, 3)
    with pytest.raises(ValueError, match="num_contexts/num_seqs"):
        split_batch(idx, 3, 7)


def test_decode_slot_ids_pads_dummy_repeats_negatives_and_out_of_range():
    # CUDA-graph padding: the dummy request's slot 8 repeated; -1 and 99 are invalid
    idx = torch.tensor([3, 0, 8, 8, 8, -1, 99], dtype=torch.int32)
    out = decode_slot_ids(idx, num_slots=9)
    assert out.dtype == torch.int32
    assert out.tolist() == [3, 0, 8, PAD_SLOT_ID, PAD_SLOT_ID, PAD_SLOT_ID, PAD_SLOT_ID]


def test_decode_slot_ids_keeps_unique_batch():
    idx = torch.randperm(64)[:32]
    assert decode_slot_ids(idx, 64).tolist() == idx.tolist()


def test_per_head_collapses_tied_hdim():
    A = torch.arange(4, dtype=torch.float32)
    A_exp = A[:, None, None].expand(4, 8, 16)
    dt = torch.randn(3, 4)
    assert torch.equal(per_head(A_exp, 1, "A"), A)
    assert torch.equal(per_head(dt[:, :, None].expand(3, 4, 8), 2, "dt"), dt)
    assert per_head(None, 1, "D") is None
    with pytest.raises(ValueError, match="dt: expected at least 2 dims"):
        per_head(A, 2, "dt")


def test_single_token_decode_vs_mtp_call():
    assert is_single_token_decode(torch.empty(2, 4, 8), {"out": None})
    assert not is_single_token_decode(torch.empty(2, 3, 4, 8), {})
    assert not is_single_token_decode(torch.empty(2, 4, 8), {"intermediate_states_buffer": torch.empty(1)})


def test_version_gate(monkeypatch):
    check_trtllm_version("1.4.0rc1")
    check_trtllm_version("1.3.0rc29")
    monkeypatch.delenv("TRTLLM_REPLAYSSM_ALLOW_ANY_TRTLLM", raising=False)
    with pytest.raises(RuntimeError, match="1.2.1 is not supported.*1.4.0rc1, 1.3.0rc29"):
        check_trtllm_version("1.2.1")


def test_bind_layer_cache_shares_upstream_state_and_prefill_resets_cursor():
    state = torch.randn(6, 8, 16, 32)  # [slots, H, P, N], TP-local
    cache = bind_layer_cache("mamba2", state, num_k_heads=2, buffer_len=4, act_dtype=torch.bfloat16)
    layer = cache.layer(0)
    assert layer.state is state and layer.x_ring.shape == (6, 8, 4, 16) and layer.B_ring.shape == (6, 2, 4, 32)
    layer.cursor.fill_(3)
    prefill_handoff(cache, torch.tensor([4, 1, -1]))
    assert layer.cursor.tolist() == [3, 0, 3, 3, 0, 3]


def test_bind_layer_cache_gdn_shapes():
    state = torch.zeros(3, 8, 16, 12)  # [slots, HV, V, K]
    layer = bind_layer_cache("gdn", state, num_k_heads=4, buffer_len=2, act_dtype=torch.float32).layer(0)
    assert layer.u_ring.shape == (3, 8, 2, 16) and layer.k_ring.shape == (3, 4, 2, 12)
    with pytest.raises(ValueError, match="family"):
        bind_layer_cache("rwkv", state, 4, 2, torch.float32)


def test_gdn_split_qkv():
    mixed = torch.arange(5 * (2 * 2 * 3 + 4 * 5), dtype=torch.float32).view(5, -1)
    q, k, v = gdn_split_qkv(mixed, 2, 3, 4, 5)
    assert q.shape == (5, 2, 3) and k.shape == (5, 2, 3) and v.shape == (5, 4, 5)
    assert torch.equal(v[0].flatten(), mixed[0, 12:])
    with pytest.raises(ValueError, match="mixed_qkv"):
        gdn_split_qkv(mixed, 2, 3, 4, 4)


def test_gdn_materialize_matches_sequential_recurrence():
    torch.manual_seed(0)
    slots, hv, h, L, K, V = 3, 4, 2, 5, 6, 7
    state = torch.randn(slots, hv, V, K)
    cache = bind_layer_cache("gdn", state, num_k_heads=h, buffer_len=L, act_dtype=torch.float32)
    layer = cache.layer(0)
    s0 = state.clone()
    w = 3  # slot 1 has 3 ring entries; slot 2 has none
    g = -torch.rand(hv, w, dtype=torch.float32)
    u = torch.randn(hv, w, V, dtype=torch.float32)
    k = torch.randn(h, w, K, dtype=torch.float32)
    layer.u_ring[1, :, :w] = u
    layer.k_ring[1, :, :w] = k
    layer.g_ring[1, :, :w] = g.cumsum(-1)
    layer.cursor[1] = w
    ref = s0[1].clone()
    for j in range(w):  # S_j = exp(g_j) S_{j-1} + u_j k_jᵀ
        kk = k[:, j].repeat_interleave(hv // h, dim=0)
        ref = torch.exp(g[:, j])[:, None, None] * ref + u[:, j, :, None] * kk[:, None, :]
    # ring values hold fp32 g cumsums: compare at fp32 precision
    gdn_materialize_slots(layer.state, layer.u_ring, layer.k_ring, layer.g_ring, layer.cursor,
                          torch.tensor([1, 2, -1]))
    torch.testing.assert_close(state[1], ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[2], s0[2])
    torch.testing.assert_close(state[0], s0[0])
    assert layer.cursor.tolist() == [0, 0, 0]
