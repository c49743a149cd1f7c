"""TensorRT-LLM metadata mapping and slot lifecycle (core functions; no TensorRT-LLM needed)."""
import pytest
import torch

from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.ops import conv as conv_ops
from trtllm_replayssm.core.ops import mamba2 as mamba2_ops
from trtllm_replayssm.serving.trtllm.core import (PAD_SLOT_ID, as_windows, check_trtllm_version, check_verify_call,
                                                  commit_conv_windows, decode_conv, decode_slot_ids,
                                                  gdn_materialize_slots, gdn_prefill_kwargs,
                                                  kda_check_conv_pool, kda_fp32_params, kda_gate_inputs,
                                                  kda_packed_conv_weight, mamba2_decode,
                                                  mamba2_ssu_attrs, mamba2_ssu_call, per_head, split_batch)
from trtllm_replayssm.serving.trtllm.model_cache import ModelReplayCache
from upstream_pools import UnifiedPool


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


def test_mamba2_ssu_attrs_cover_the_revisions_single_and_mtp_calls():
    """The SSU attributes the Mamba-2 glue takes over, by the attribute sets of the upstream revisions read: one SSU
    for both calls (@02140fd4), or the split single-token and MTP ones (a later stored revision, whose per-draft MTP
    verify calls ``_mtp_ssu_func`` with the same arguments): a verify reaches ReplaySSM in either, and a mixer without
    a single-token SSU is not hooked."""
    class Mixer:  # the attribute sets only
        def __init__(self, *names: str) -> None:
            for name in names:
                setattr(self, name, object())

    assert mamba2_ssu_attrs(Mixer("selective_state_update_func")) == ("selective_state_update_func",)
    assert mamba2_ssu_attrs(Mixer("_stp_ssu_func", "_mtp_ssu_func")) == ("_stp_ssu_func", "_mtp_ssu_func")
    assert mamba2_ssu_attrs(Mixer("_mtp_ssu_func")) == ()
    assert mamba2_ssu_attrs(Mixer()) == ()


def test_single_token_decode_vs_mtp_call():
    decode, window = torch.empty(2, 4, 8), torch.empty(2, 3, 4, 8)
    assert mamba2_ssu_call("f", decode, {"out": None}, verifies=False) == "decode"
    assert mamba2_ssu_call("f", window, {"disable_state_update": True}, verifies=True) == "verify"
    # every other call would run upstream's SSU on the checkpoint, which lags the live state: an error, never a fallback
    refused = [(decode, {"rand_seed": torch.zeros(1)}, False),  # quant_config.mamba_ssm_stochastic_rounding
               (decode, {"intermediate_states_buffer": torch.empty(1)}, False), (decode, {"cache_steps": 3}, False),
               (window, {"disable_state_update": True}, False), (decode, {}, True), (window, {}, True),
               (window, {"disable_state_update": True, "rand_seed": torch.zeros(1)}, True)]
    for x, kw, verifies in refused:
        with pytest.raises(RuntimeError, match=r"a Mamba-2 SSU call \(_stp_ssu_func: x"):
            mamba2_ssu_call("_stp_ssu_func", x, kw, verifies)


def test_version_gate(monkeypatch):
    check_trtllm_version("1.4.0rc1")
    check_trtllm_version("1.3.0rc29")
    monkeypatch.delenv("TRTLLM_REPLAYSSM_ALLOW_ANY_TRTLLM", raising=False)
    with pytest.raises(RuntimeError, match="1.2.1 is not supported.*1.4.0rc1, 1.3.0rc29"):
        check_trtllm_version("1.2.1")


def test_gdn_split_qkv():
    mixed = torch.arange(5 * (2 * 2 * 3 + 4 * 5), dtype=torch.float32).view(5, -1)
    q, k, v = GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=3, head_v_dim=5).split_qkv(mixed)
    assert q.shape == (5, 2, 3) and k.shape == (5, 2, 3) and v.shape == (5, 4, 5)
    assert torch.equal(k[1].flatten(), mixed[1, 6:12]) and torch.equal(v[0].flatten(), mixed[0, 12:])
    assert v.data_ptr() == mixed.data_ptr() + 12 * mixed.element_size()  # views
    with pytest.raises(ValueError, match=r"^mixed_qkv: expected shape \[\.\.\., 28\], got \(5, 32\)"):
        GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=3, head_v_dim=4).split_qkv(mixed)


def test_as_windows():
    """Each decode row's T tokens are adjacent: window r, token t is token r * T + t, as views."""
    q, beta = torch.randn(6, 2, 3), torch.randn(6, 2)
    wq, wbeta = as_windows(3, 2, q=q, beta=beta)
    assert wq.shape == (3, 2, 2, 3) and wbeta.shape == (3, 2, 2) and wq.data_ptr() == q.data_ptr()
    for r in range(3):
        for t in range(2):
            assert torch.equal(wq[r, t], q[2 * r + t]) and torch.equal(wbeta[r, t], beta[2 * r + t])
    with pytest.raises(ValueError, match="beta: expected 2 windows of 3 tokens"):
        as_windows(2, 3, q=q, beta=beta[:5])
    for n, T in ((4, 2), (0, 2), (6, 0)):
        with pytest.raises(ValueError, match="q: expected"):
            as_windows(n, T, q=q)
    (one,) = as_windows(1, 6, g=beta[:, 0])  # one decode row, 1-D per-token values
    assert one.shape == (1, 6) and torch.equal(one[0], beta[:, 0])
    assert as_windows(6, 1, q=q)[0].shape == (6, 1, 2, 3)  # windows of one token
    with pytest.raises(ValueError, match="x: expected 1 windows of 1 tokens"):
        as_windows(1, 1, x=torch.tensor(1.0))  # a 0-d tensor holds no tokens


def test_check_verify_call():
    check_verify_call("GDN", True, 3)
    check_verify_call("GDN", True, 2)  # windows of one draft token
    check_verify_call("KDA", False, 1)
    with pytest.raises(RuntimeError, match="a single-token decode of a KDA layer in a model that verifies MTP"):
        check_verify_call("KDA", False, 4)
    with pytest.raises(RuntimeError, match="an MTP verify of a GDN layer in a model that does not verify"):
        check_verify_call("GDN", True, 1)


def _gdn_extend_kwargs(prefills: list[int], decodes: int, window: int) -> dict:
    """forward_core's keywords (the keys TensorRT-LLM builds, trtllm_symbols.json) for a mixed MTP batch."""
    p_tokens, d_tokens = sum(prefills), decodes * window
    tokens = p_tokens + d_tokens
    starts = torch.tensor([0, *torch.tensor(prefills).cumsum(0).tolist()] + [p_tokens + window * (i + 1)
                                                                             for i in range(decodes)])
    slots = torch.arange(len(prefills) + decodes, dtype=torch.int32) * 3 + 1
    return {"mixed_qkv": torch.randn(tokens, 8), "a": torch.randn(tokens, 2), "b": torch.randn(tokens, 2),
            "has_initial_states": torch.tensor([False, True] * 4)[:len(prefills) + decodes],
            "cache_indices": slots, "query_start_loc": starts.int(), "query_start_loc_long": starts.long(),
            "batch_size": len(prefills) + decodes, "num_prefill_tokens": p_tokens, "num_decode_tokens": d_tokens,
            "state_indices_p": slots[:len(prefills)], "state_indices_d": slots[len(prefills):],
            "num_prefill": len(prefills), "num_decodes": decodes, "use_replay": False, "replay_metadata": None,
            "layer_cache": object(), "replay_work_items": None, "replay_n_writes": None,
            "use_cached_replay_all_layer_commit": False}


def test_gdn_prefill_kwargs_keep_the_prefill_rows_only():
    kw = _gdn_extend_kwargs([5, 3], decodes=3, window=4)
    out = gdn_prefill_kwargs(kw)
    assert set(out) <= set(kw)
    assert out["mixed_qkv"].shape[0] == 8 and torch.equal(out["a"], kw["a"][:8]) and torch.equal(out["b"], kw["b"][:8])
    assert out["batch_size"] == out["num_prefill"] == 2 and out["num_decodes"] == out["num_decode_tokens"] == 0
    assert out["cache_indices"].tolist() == kw["state_indices_p"].tolist() and out["state_indices_d"].numel() == 0
    assert out["query_start_loc_long"].tolist() == [0, 5, 8] and out["has_initial_states"].tolist() == [False, True]
    assert out["num_prefill_tokens"] == 8 and out["use_replay"] is False
    kw["use_cached_replay_all_layer_commit"] = True  # upstream's replay commit never runs on the prefill rows' call
    assert gdn_prefill_kwargs(kw)["use_cached_replay_all_layer_commit"] is False
    assert "layer_cache" not in out and "replay_metadata" not in out
    one = gdn_prefill_kwargs(_gdn_extend_kwargs([6], decodes=2, window=2))  # one prefill row is enough
    assert one["batch_size"] == 1 and one["mixed_qkv"].shape[0] == 6 and one["query_start_loc"].tolist() == [0, 6]
    with pytest.raises(ValueError, match="num_prefill"):
        gdn_prefill_kwargs(_gdn_extend_kwargs([], decodes=2, window=2))
    # a stored upstream variant's forward_core adds full-batch scan layouts, which its prefill path prefers: refused
    with pytest.raises(RuntimeError, match=r"not written against \(scan_cu_seqlens, scan_state_indices\)"):
        gdn_prefill_kwargs({**kw, "scan_state_indices": kw["cache_indices"], "scan_cu_seqlens": kw["query_start_loc"]})


def test_gdn_materialize_matches_sequential_recurrence():
    torch.manual_seed(0)
    slots, hv, h, L, K, V = 3, 4, 2, 5, 6, 7
    state = torch.randn(slots, hv, V, K)
    cache = ModelReplayCache("gdn", [3], num_k_heads=h, buffer_len=L, act_dtype=torch.float32)
    layer = cache.layer(3, state)
    s0 = state.clone()
    w = 3  # slot 1 has 3 ring entries; slot 2 has none
    g = -torch.rand(hv, w, dtype=torch.float32)
    u = torch.randn(hv, w, V, dtype=torch.float32)
    k = torch.randn(h, w, K, dtype=torch.float32)
    layer.u_ring[1, :, :w] = u
    layer.k_ring[1, :, :w] = k
    layer.g_ring[1, :, :w] = g.cumsum(-1)
    layer.cursor[1] = w
    for ring in (layer.u_ring, layer.k_ring, layer.g_ring):  # records past the cursor may hold anything
        ring[1, :, w:] = float("nan")
        ring[2] = float("nan")
    ref = s0[1].clone()
    for j in range(w):  # S_j = exp(g_j) S_{j-1} + u_j k_jᵀ
        kk = k[:, j].repeat_interleave(hv // h, dim=0)
        ref = torch.exp(g[:, j])[:, None, None] * ref + u[:, j, :, None] * kk[:, None, :]
    # ring values hold fp32 g cumsums: compare at fp32 precision
    gdn_materialize_slots(layer, torch.tensor([1, 2]))
    torch.testing.assert_close(state[1], ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(state[2], s0[2])
    torch.testing.assert_close(state[0], s0[0])
    assert layer.cursor.tolist() == [0, 0, 0]


def test_kda_packed_conv_weight_matches_per_section_depthwise_conv():
    torch.manual_seed(0)
    D, W = 6, 4
    ws = [torch.randn(D, 1, W) for _ in range(3)]
    packed = kda_packed_conv_weight(*ws)
    assert packed.shape == (3 * D, W)
    window = torch.randn(2, 3 * D, W)  # [b, 3D, W]: conv pool window (W-1) + current token
    out = (window * packed).sum(-1)
    for i, w in enumerate(ws):
        ref = torch.nn.functional.conv1d(window[:, i * D:(i + 1) * D], w, groups=D)[..., -1]
        torch.testing.assert_close(out[:, i * D:(i + 1) * D], ref)
    with pytest.raises(ValueError, match="equal shapes"):
        kda_packed_conv_weight(ws[0], ws[1], torch.randn(D, 1, W + 1))
    with pytest.raises(ValueError, match="k_weight"):
        kda_packed_conv_weight(ws[0], torch.randn(D, 2, W), ws[2])


def test_kda_check_conv_pool_layout():
    kda_check_conv_pool(torch.empty(5, 3 * 8, 3), proj_size=8, conv_size=4)
    with pytest.raises(ValueError, match=r"conv_pool: expected shape \[slots, 24, 3\]"):
        kda_check_conv_pool(torch.empty(5, 3 * 8, 4), proj_size=8, conv_size=4)  # older full-W window


def test_kda_split_qkv_and_gate_inputs():
    H, D, b = 2, 3, 4
    mixed = torch.arange(b * 3 * H * D, dtype=torch.float32).view(b, -1)
    q, k, v = KDADims(num_heads=H, head_dim=D).split_qkv(mixed)
    assert q.shape == k.shape == v.shape == (b, H, D)
    assert torch.equal(k[1].flatten(), mixed[1, H * D:2 * H * D]) and torch.equal(v[0, 1], mixed[0, -D:])
    with pytest.raises(ValueError, match="mixed_qkv"):
        KDADims(num_heads=H, head_dim=D).split_qkv(mixed[:, :-1])
    g_hidden, beta = torch.randn(b, H * D), torch.randn(b, H)
    g, beta2 = kda_gate_inputs(g_hidden, beta, H, D)
    assert g.shape == (b, H, D) and torch.equal(g[2, 1], g_hidden[2, D:]) and beta2 is beta
    with pytest.raises(ValueError, match="beta"):
        kda_gate_inputs(g_hidden, torch.randn(b, H + 1), H, D)


def test_kda_fp32_params_from_bf16_parameters():
    A_log = torch.randn(4).bfloat16()
    dt_bias = torch.randn(4 * 8).bfloat16()
    a, d = kda_fp32_params(A_log, dt_bias, 4, 8)
    assert a.dtype == d.dtype == torch.float32 and a.shape == (4,) and d.shape == (4, 8) and d.is_contiguous()
    assert torch.equal(d.flatten(), dt_bias.float())
    with pytest.raises(ValueError, match="dt_bias: expected 32"):
        kda_fp32_params(A_log, dt_bias[:-1], 4, 8)


def test_kda_hook_composition_matches_baseline_step_on_cpu():
    """The argument mapping of the KDA hook (split, gates, fp32 params, slot ids) fed to the replay op gives the
    same outputs and state as the baseline op over a few decode steps (CPU reference path)."""
    from trtllm_replayssm.core.ops import kda

    torch.manual_seed(1)
    slots, H, D, L, b = 4, 2, 64, 3, 3
    state0 = torch.randn(slots, H, D, D) * 0.1
    replay_state = state0.clone()
    cache = ModelReplayCache("kda", [0], num_k_heads=H, buffer_len=L, act_dtype=torch.float32)
    base_state = state0.clone()
    A_log, dt_bias = kda_fp32_params(torch.randn(H), torch.randn(H * D) * 0.1, H, D)
    raw_slots = torch.tensor([2, 0, 0], dtype=torch.int32)  # CUDA-graph padding repeats slot 0
    ids = decode_slot_ids(raw_slots, slots)
    for step in range(5):
        q, k, v = KDADims(num_heads=H, head_dim=D).split_qkv(torch.randn(b, 3 * H * D))
        g, beta = kda_gate_inputs(torch.randn(b, H * D), torch.randn(b, H), H, D)
        out_r = torch.full((b, H, D), float("nan"))
        out_b = torch.full((b, H, D), float("nan"))
        kda.replay_decode(cache.layer(0, replay_state[:]), q, k, v, g, beta, A_log, dt_bias, lower_bound=-5.0, scale=D ** -0.5,
                          state_batch_indices=ids, pad_slot_id=PAD_SLOT_ID, out=out_r, mode="replay")
        kda.state_update(base_state, q, k, v, g, beta, A_log, dt_bias, lower_bound=-5.0, scale=D ** -0.5,
                         state_batch_indices=ids, pad_slot_id=PAD_SLOT_ID, out=out_b)
        torch.testing.assert_close(out_r[:2], out_b[:2], rtol=1e-4, atol=1e-4)
        assert torch.equal(out_r[2], torch.zeros(H, D)) and torch.equal(out_b[2], torch.zeros(H, D))  # padded row
        if step == L - 1:  # the flush step folds the ring: the checkpoint is the live state
            torch.testing.assert_close(replay_state[[0, 2]], base_state[[0, 2]], rtol=1e-4, atol=1e-4)
    assert cache.layer(0, replay_state).cursor.tolist() == [2, 0, 2, 0]  # 5 steps, L=3: 1, 2, flush->0, 1, 2
    assert cache.binds == 1  # a fresh view of the same pool every step


def test_decode_slot_ids_takes_int64_indices():
    """Some revisions hand KDA int64 slot indices (``state_indices_long``); the ops get int32 either way."""
    idx = torch.tensor([5, 2, 2], dtype=torch.int64)
    out = decode_slot_ids(idx, num_slots=8)
    assert out.dtype == torch.int32 and out.tolist() == [5, 2, PAD_SLOT_ID]


def test_commit_conv_windows_takes_each_rows_accepted_window():
    gen = torch.Generator().manual_seed(0)
    conv = torch.randn(6, 5, 3, generator=gen)
    windows = torch.randn(4, 3, 5, 3, generator=gen)  # [rows, T, conv_dim, W-1]; the last row is spare
    before = conv.clone()
    idx = torch.tensor([4, 0, 2], dtype=torch.int32)
    accepted = torch.tensor([1, 3, 2], dtype=torch.int32)
    commit_conv_windows([(conv, windows)], accepted, idx)
    for b, (slot, a) in enumerate(zip(idx.tolist(), accepted.tolist())):
        assert torch.equal(conv[slot], windows[b, a - 1])
    untouched = [s for s in range(6) if s not in idx.tolist()]
    assert torch.equal(conv[untouched], before[untouched])
    with pytest.raises(ValueError, match=r"^accepted: expected shape \(3,\)"):
        commit_conv_windows([(conv, windows)], accepted[:2], idx)
    with pytest.raises(ValueError, match=r"^windows: expected \[>= 3, T, 5, 3\]"):
        commit_conv_windows([(conv, windows[:, :, :4])], accepted, idx)



def _conv_pool(slots: int, channels: int, taps: int, ssm_bytes: int, gen: torch.Generator) -> torch.Tensor:
    """A conv view of a unified pool (``tests/upstream_pools.UnifiedPool``'s layout: each block its SSM bytes, then
    its conv bytes), ``[slots, channels, taps]`` bf16 with a block stride beyond channels x taps."""
    conv_bytes = channels * taps * 2
    blocks = torch.randint(0, 256, (slots, ssm_bytes + conv_bytes), generator=gen, dtype=torch.uint8)
    return blocks[:, ssm_bytes:].view(torch.bfloat16).unflatten(1, (channels, taps))


def test_decode_conv_runs_ours_with_upstreams_numerics_on_a_unified_pool():
    """decode_conv on the conv view of a unified pool, with graph padding rows (upstream's ids repeat the dummy slot;
    decode_slot_ids makes the repeats pad rows): the live rows' outputs are SiLU of the fp32 conv rounded once
    (upstream's causal_conv1d_update), their slots shifted, every other byte of the pool untouched; upstream's conv
    is not called."""
    gen = torch.Generator().manual_seed(3)
    slots, channels, width = 9, 48, 4
    pool = _conv_pool(slots, channels, width - 1, ssm_bytes=160, gen=gen)
    pool.copy_(torch.randn(pool.shape, generator=gen).to(torch.bfloat16))
    before = pool.clone()
    weight = torch.randn(channels, width, generator=gen).to(torch.bfloat16)
    bias = torch.randn(channels, generator=gen).to(torch.bfloat16)
    x = torch.randn(4, channels, generator=gen).to(torch.bfloat16)
    ids = decode_slot_ids(torch.tensor([6, 2, 8, 8], dtype=torch.int32), slots)  # the last row pads on the dummy 8
    out, own = decode_conv(x, pool, weight, bias, "silu", ids, lambda: pytest.fail("upstream's conv was called"))
    assert own
    for row, slot in enumerate([6, 2, 8]):
        window = torch.cat([before[slot].float(), x[row].float()[:, None]], -1)
        y = (window * weight.float()).sum(-1) + bias.float()
        assert torch.equal(out[row], (y / (1 + torch.exp(-y))).to(torch.bfloat16))  # upstream's SiLU, one rounding
        assert torch.equal(pool[slot], window[:, 1:].to(torch.bfloat16))
    untouched = [s for s in range(slots) if s not in (6, 2, 8)]
    assert torch.equal(pool[untouched], before[untouched])


@pytest.mark.parametrize("case", ["activation", "weight dtype", "weight width"])
def test_decode_conv_leaves_what_ours_cannot_take_to_upstream(case):
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(2, 16, generator=gen).to(torch.bfloat16)
    pool = torch.zeros(3, 16, 3, dtype=torch.bfloat16)
    weight = {"weight dtype": torch.randn(16, 4), "weight width": torch.randn(16, 12).to(torch.bfloat16)}.get(
        case, torch.randn(16, 4).to(torch.bfloat16))
    sentinel = torch.full((2, 16), 7.0)
    out, own = decode_conv(x, pool, weight, None, "gelu" if case == "activation" else "silu",
                           torch.tensor([0, 2], dtype=torch.int32), lambda: sentinel)
    assert out is sentinel and not own and torch.equal(pool, torch.zeros_like(pool))


def test_mamba2_dims_split_the_projection_into_views_and_name_a_bad_width():
    """Mamba2Dims.split_zxbcdt / split_xbc: views of the sections z | xBC | dt and x | B | C (any leading dims); a
    wrong last dim is a ValueError naming the argument and the width expected."""
    dims = Mamba2Dims(nheads=4, head_dim=8, d_state=32, n_groups=2)
    zxbcdt = torch.arange(3 * 2 * 196, dtype=torch.float32).reshape(3, 2, 196)
    z, xbc, dt = dims.split_zxbcdt(zxbcdt)
    assert (z.shape, xbc.shape, dt.shape) == ((3, 2, 32), (3, 2, 160), (3, 2, 4))
    assert torch.equal(torch.cat([z, xbc, dt], -1), zxbcdt) and xbc.data_ptr() == zxbcdt[..., 32:].data_ptr()
    x, B, C = dims.split_xbc(xbc)  # noqa: N806
    assert (x.shape, B.shape, C.shape) == ((3, 2, 4, 8), (3, 2, 2, 32), (3, 2, 2, 32))
    assert torch.equal(torch.cat([x.flatten(-2), B.flatten(-2), C.flatten(-2)], -1), xbc)
    assert C.data_ptr() == xbc[..., 96:].data_ptr()
    with pytest.raises(ValueError, match=r"^zxbcdt: expected shape \[\.\.\., 196\]"):
        dims.split_zxbcdt(zxbcdt[..., 1:])
    with pytest.raises(ValueError, match=r"^xbc: expected shape \[\.\.\., 160\]"):
        dims.split_xbc(zxbcdt)


def _mamba2_served_decode(seed: int, weight_dtype: torch.dtype, device: str = "cpu"):
    """A small Mamba-2 layer on a unified pool on ``device`` (its SSM view and its bf16 conv view, random contents),
    two identical copies (``ModelReplayCache`` and pool each), a conv weight of ``weight_dtype`` and the layer's
    parameters."""
    gen = torch.Generator().manual_seed(seed)
    H, P, G, N, W = 4, 8, 2, 32, 4  # noqa: N806
    conv_dim = H * P + 2 * G * N
    pools = []
    for _ in range(2):
        gen_copy = torch.Generator().manual_seed(seed + 1)
        pool = UnifiedPool([3], 7, (H, P, N), torch.float32, conv_bytes=conv_dim * (W - 1) * 2, device=device)
        pool.pool.copy_(torch.randint(0, 256, pool.pool.shape, generator=gen_copy, dtype=torch.uint8))
        ssm = pool.get_ssm_states(3)
        ssm.copy_(torch.randn(ssm.shape, generator=gen_copy))
        conv = pool.pool[0, :, pool.ssm_bytes:].view(torch.bfloat16).unflatten(1, (conv_dim, W - 1))
        conv.copy_(torch.randn(conv.shape, generator=gen_copy).to(torch.bfloat16))
        cache = ModelReplayCache("mamba2", [3], num_k_heads=G, buffer_len=4, act_dtype=torch.bfloat16)
        pools.append((pool, conv, cache))
    params = dict(conv_weight=torch.randn(conv_dim, W, generator=gen).to(weight_dtype),
                  conv_bias=torch.randn(conv_dim, generator=gen).to(weight_dtype),
                  A=-torch.rand(H, generator=gen) - 0.5, D=torch.randn(H, generator=gen),
                  dt_bias=torch.randn(H, generator=gen) * 0.5)
    params = {k: v.to(device) for k, v in params.items()}
    return pools, params, (H, P, G, N)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_mamba2_decode_on_views_equals_the_hooked_ssu_on_upstreams_copies(device):
    """core.mamba2_decode (our conv1d step on in_proj's xBC section, then the decode op on strided views of its
    output and of dt) equals what the hooked SSU computes on upstream's path (its conv, contiguous x, B, C, dt in
    fp32), over 6 steps of a 4-token ring (flushes included) with a graph padding row on the dummy's slot: the SSM
    outputs, z (a view of in_proj's output), the pad row's zeros and every byte of the pool (on CUDA but the dummy's
    slot, on which the padding row's conv races as upstream's does); the plan is asked for the launch behind our
    conv."""
    pools, p, (H, P, G, N) = _mamba2_served_decode(11, torch.bfloat16, device)  # noqa: N806
    dims = Mamba2Dims(nheads=H, head_dim=P, d_state=N, n_groups=G)
    (pool, conv, cache), (ref_pool, ref_conv, ref_cache) = pools
    gen = torch.Generator().manual_seed(12)
    ids = torch.tensor([5, 1, 6, 6], dtype=torch.int32, device=device)  # the last row pads on the dummy's slot 6
    live, blocks = ([0, 1, 2], list(range(7))) if device == "cpu" else ([0, 1], [0, 1, 2, 3, 4, 5])
    asked = []
    for _ in range(6):
        zxbcdt = torch.randn(4, 2 * H * P + 2 * G * N + H, generator=gen).to(device, torch.bfloat16)
        cache.begin_step()
        layer = cache.layer_step(3, pool.get_ssm_states(3), ids, 0)
        y, z = mamba2_decode(layer, dims, zxbcdt, conv, p["conv_weight"], p["conv_bias"], p["A"], p["D"],
                             p["dt_bias"], True, cache.decode_slots(ids),
                             lambda after_conv: asked.append(after_conv)
                             or cache.decode_plan(layer, 4, after_conv=after_conv),
                             lambda xbc: pytest.fail("upstream's conv was called"))
        cache.end_step()

        ref_cache.begin_step()
        ref_layer = ref_cache.layer_step(3, ref_pool.get_ssm_states(3), ids, 0)
        slots = ref_cache.decode_slots(ids)
        z_ref, xbc, dt = dims.split_zxbcdt(zxbcdt)
        xbc = conv_ops.conv1d_update(xbc.contiguous(), ref_conv, p["conv_weight"], p["conv_bias"], True, slots,
                                     round_once=True)
        x, B, C = (t.contiguous() for t in dims.split_xbc(xbc))  # noqa: N806
        y_ref = mamba2_ops.replay_decode(ref_layer, x, dt.float(), p["A"], B, C, D=p["D"], dt_bias=p["dt_bias"],
                                         state_batch_indices=slots, pad_slot_id=PAD_SLOT_ID,
                                         plan=ref_cache.decode_plan(ref_layer, 4, after_conv=True))
        ref_cache.end_step()

        assert torch.equal(y.view(4, H, P)[live], y_ref[live])
        assert torch.equal(y[3], torch.zeros_like(y[3]))
        assert torch.equal(z, z_ref) and z.data_ptr() == zxbcdt.data_ptr()
        assert torch.equal(pool.pool[:, blocks], ref_pool.pool[:, blocks])
    assert asked == [True] * 6


def test_mamba2_decode_leaves_a_conv_ours_cannot_take_to_upstream():
    """A conv weight whose dtype is not the activations' goes to upstream's conv on the xBC view, and the decode op
    is planned for a plain launch."""
    pools, p, (H, P, G, N) = _mamba2_served_decode(13, torch.float32)  # noqa: N806
    pool, conv, cache = pools[0]
    zxbcdt = torch.randn(2, 2 * H * P + 2 * G * N + H).to(torch.bfloat16)
    ids = torch.tensor([2, 4], dtype=torch.int32)
    asked, conv_inputs = [], []
    cache.begin_step()
    layer = cache.layer_step(3, pool.get_ssm_states(3), ids, 0)
    upstream_out = torch.randn(2, H * P + 2 * G * N).to(torch.bfloat16)
    before = conv.clone()
    y, _ = mamba2_decode(layer, Mamba2Dims(nheads=H, head_dim=P, d_state=N, n_groups=G), zxbcdt, conv,
                         p["conv_weight"], p["conv_bias"], p["A"], p["D"], p["dt_bias"], True, cache.decode_slots(ids),
                         lambda after_conv: asked.append(after_conv) or cache.decode_plan(layer, 2),
                         lambda xbc: conv_inputs.append(xbc) or upstream_out)
    cache.end_step()
    assert asked == [False] and len(conv_inputs) == 1
    assert conv_inputs[0].data_ptr() == zxbcdt[:, H * P:].data_ptr()
    assert torch.equal(conv, before) and torch.isfinite(y).all()
