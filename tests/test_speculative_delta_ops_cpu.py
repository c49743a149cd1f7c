"""CPU: the speculative GDN/KDA ops (``verify_decode``, the family-agnostic ``spec.commit``,
``per_draft_verify_decode``, ``per_draft_commit``) dispatch to the float32 references, and their argument errors name
the argument before any launch."""
from __future__ import annotations

import pytest
import torch

from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.ops import delta, spec
from trtllm_replayssm.core.ops import gdn as gdn_ops
from trtllm_replayssm.core.ops import kda as kda_ops
from trtllm_replayssm.core.reference import gdn as gdn_ref
from trtllm_replayssm.core.reference import kda as kda_ref

H, HV, K, V, L, SLOTS, T = 2, 4, 64, 32, 8, 5, 3
IDX = torch.tensor([4, -1, 1], dtype=torch.int32)
ROWS = [0, 2]


def _layers(family: str):
    def make():
        if family == "gdn":
            return ReplayStateCache.gdn(1, SLOTS, H, HV, K, V, buffer_len=L, device="cpu").layer(0)
        return ReplayStateCache.kda(1, SLOTS, HV, K, buffer_len=L, device="cpu").layer(0)
    first, second = make(), make()
    init = torch.randn(first.state.shape, generator=torch.Generator().manual_seed(1))
    first.state.copy_(init)
    second.state.copy_(init)
    return first, second


def _window(family: str, gen: torch.Generator, batch: int = 3) -> dict:
    heads, dim_v = (H, V) if family == "gdn" else (HV, K)
    x = dict(q=torch.randn(batch, T, heads, K, generator=gen).bfloat16(),
             k=torch.randn(batch, T, heads, K, generator=gen).bfloat16(),
             v=torch.randn(batch, T, HV, dim_v, generator=gen).bfloat16(), A_log=torch.zeros(HV))
    if family == "gdn":
        x.update(a=torch.randn(batch, T, HV, generator=gen), b=torch.randn(batch, T, HV, generator=gen).bfloat16(),
                 dt_bias=torch.zeros(HV))
    else:
        x.update(g=torch.randn(batch, T, HV, K, generator=gen), beta=torch.randn(batch, T, HV, generator=gen),
                 dt_bias=torch.zeros(HV, K), lower_bound=-5.0)
    return x


def _ref_args(family: str, x: dict) -> tuple:
    if family == "gdn":
        return x["q"], x["k"], x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], None
    return x["q"], x["k"], x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], -5.0, None


@pytest.mark.parametrize("family", ["gdn", "kda"])
def test_cpu_dispatch_is_the_reference(family):
    ops, ref = (gdn_ops, gdn_ref) if family == "gdn" else (kda_ops, kda_ref)
    gen = torch.Generator().manual_seed(2)
    layer, mirror = _layers(family)
    for k in range(6):
        x = _window(family, gen)
        out = ops.verify_decode(layer, **x, state_batch_indices=IDX)
        ref_out = torch.zeros_like(out)
        ref.verify_step_(mirror.state, mirror.u_ring, mirror.k_ring, mirror.g_ring, mirror.cursor,
                         *_ref_args(family, x), IDX, -1, ref_out)
        assert torch.equal(out[ROWS], ref_out[ROWS]) and (out[1] == 0).all()
        accepted = torch.tensor([T, 2, 1 + k % T], dtype=torch.int32)
        spec.commit(layer, accepted, IDX, -1, window=T)
        spec_cursor.commit_(mirror.cursor, accepted, IDX, -1, T)
        for name, t in layer.tensors().items():
            assert torch.equal(t.nan_to_num(), getattr(mirror, name).nan_to_num()), name
    pool, twin = layer.state.clone(), layer.state.clone()
    inter = torch.empty(3, T, *pool.shape[1:])
    twin_inter = torch.empty_like(inter)
    x = _window(family, gen)
    out = ops.per_draft_verify_decode(pool, inter, **x, state_batch_indices=IDX)
    ref_out = torch.zeros_like(out)
    ref.per_draft_verify_(twin, twin_inter, *_ref_args(family, x), IDX, -1, ref_out)
    assert torch.equal(out, ref_out) and torch.equal(inter[ROWS], twin_inter[ROWS]) and torch.equal(pool, twin)
    accepted = torch.tensor([2, 1, 3], dtype=torch.int32)
    ops.per_draft_commit(pool, inter, accepted, IDX)
    assert torch.equal(pool[4], inter[0, 1]) and torch.equal(pool[1], inter[2, 2])
    assert torch.equal(pool[[0, 2, 3]], twin[[0, 2, 3]])


def test_per_draft_state_after_each_token_is_the_baseline_step():
    gen = torch.Generator().manual_seed(3)
    layer, _ = _layers("gdn")
    pool, base = layer.state.clone(), layer.state.clone()
    x = _window("gdn", gen)
    inter = torch.empty(3, T, *pool.shape[1:])
    out = gdn_ops.per_draft_verify_decode(pool, inter, **x, state_batch_indices=IDX)
    for t in range(T):
        y = gdn_ops.state_update(base, **{key: (val[:, t] if val.dim() >= 3 and key in "qkvab" else val)
                                          for key, val in x.items()}, state_batch_indices=IDX)
        torch.testing.assert_close(out[:, t], y, rtol=1e-2, atol=1e-2)
        torch.testing.assert_close(inter[ROWS, t], base[IDX[ROWS].long()], rtol=1e-5, atol=1e-5)


def test_argument_errors_name_the_argument():
    gen = torch.Generator().manual_seed(4)
    layer, _ = _layers("gdn")
    x = _window("gdn", gen)
    with pytest.raises(ValueError, match=r"^q: window tokens \(dim 1\) must be 1..8, got 9"):
        gdn_ops.verify_decode(layer, **_window_of(x, 9), state_batch_indices=IDX)
    with pytest.raises(ValueError, match=r"^a: expected shape \[3, 3, 4\]"):
        gdn_ops.verify_decode(layer, **{**x, "a": x["a"][:, :2]}, state_batch_indices=IDX)
    with pytest.raises(ValueError, match=r"^out: dims 0 and 1 must be mergeable"):
        gdn_ops.verify_decode(layer, **x, state_batch_indices=IDX,
                              out=torch.empty(T, 3, HV, V, dtype=torch.bfloat16).transpose(0, 1))
    with pytest.raises(ValueError, match=r"^window: 5 tokens need rings of at least 10 records"):
        gdn_ops.verify_decode(layer, **_window_of(x, 5), state_batch_indices=IDX)
    with pytest.raises(ValueError, match=r"^window: expected 1..8 tokens per verify"):
        spec.commit(layer, torch.ones(3, dtype=torch.int32), IDX, window=9)
    with pytest.raises(TypeError, match=r"^accepted: expected dtype in \['torch.int32'\], got torch.int64"):
        spec.commit(layer, torch.ones(3, dtype=torch.int64), IDX, window=T)
    with pytest.raises(ValueError, match=r"^accepted: expected 1..3 per row"):
        spec.commit(layer, torch.tensor([1, 1, 4], dtype=torch.int32), IDX, window=T)
    with pytest.raises(TypeError, match=r"^layer: expected a KDALayerCache"):
        kda_ops.verify_decode(layer, **_window("kda", gen), state_batch_indices=IDX)
    inter = torch.empty(3, T, *layer.state.shape[1:], dtype=torch.bfloat16)
    with pytest.raises(TypeError, match=r"^inter: expected the dtype of state \(torch.float32\)"):
        gdn_ops.per_draft_verify_decode(layer.state, inter, **x, state_batch_indices=IDX)
    with pytest.raises(ValueError, match=r"^inter: expected shape \[3, 3, 4, 32, 64\]"):
        gdn_ops.per_draft_verify_decode(layer.state, inter.float()[:, :2], **x, state_batch_indices=IDX)
    with pytest.raises(ValueError, match=r"^accepted: expected shape \[3\]"):
        delta.per_draft_commit(layer.state, inter.float(), torch.ones(2, dtype=torch.int32), IDX)
    layer.cursor[4] = spec_cursor.pack(2, L - 2)  # a window of 3 no longer fits
    with pytest.raises(ValueError, match=r"^cursor: slot 4 holds word 1538 \(origin, count\) = \(2, 6\)"):
        gdn_ops.verify_decode(layer, **x, state_batch_indices=IDX)


def _window_of(x: dict, tokens: int) -> dict:
    """``x`` with every per-token input repeated to ``tokens`` tokens."""
    return {key: (val[:, :1].expand(-1, tokens, *val.shape[2:]) if key in "qkvab" else val) for key, val in x.items()}
