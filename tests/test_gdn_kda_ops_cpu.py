"""CPU: GDN/KDA op validation (errors name the argument), CPU dispatch to the float32 references, and the NVRTC
compilation of the delta-rule kernel configs for every target arch without register spills."""
from __future__ import annotations

import pytest
import torch

from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.jit.compiler import compile_config, resource_usage
from trtllm_replayssm.core.ops import delta
from trtllm_replayssm.core.ops import gdn as gdn_ops
from trtllm_replayssm.core.ops import kda as kda_ops
from trtllm_replayssm.core.reference import gdn as gdn_ref
from trtllm_replayssm.core.reference import kda as kda_ref
from trtllm_replayssm.core.targets import SUPPORTED_ARCHS

H, HV, K, V, L, SLOTS, BATCH = 2, 4, 64, 32, 4, 5, 3


def _gdn_step(gen, dtype=torch.bfloat16):
    return dict(q=torch.randn(BATCH, H, K, generator=gen).to(dtype), k=torch.randn(BATCH, H, K, generator=gen).to(dtype),
                v=torch.randn(BATCH, HV, V, generator=gen).to(dtype), a=torch.randn(BATCH, HV, generator=gen).to(dtype),
                b=torch.randn(BATCH, HV, generator=gen), A_log=torch.zeros(HV), dt_bias=torch.zeros(HV))


def _kda_step(gen, dtype=torch.bfloat16):
    return dict(q=torch.randn(BATCH, HV, K, generator=gen).to(dtype),
                k=torch.randn(BATCH, HV, K, generator=gen).to(dtype),
                v=torch.randn(BATCH, HV, K, generator=gen).to(dtype),
                g=torch.randn(BATCH, HV, K, generator=gen), beta=torch.randn(BATCH, HV, generator=gen).to(dtype),
                A_log=torch.zeros(HV), dt_bias=torch.zeros(HV, K), lower_bound=-5.0)


def _caches(family):
    make = (lambda: ReplayStateCache.gdn(1, SLOTS, H, HV, K, V, buffer_len=L, device="cpu")) if family == "gdn" else \
        (lambda: ReplayStateCache.kda(1, SLOTS, HV, K, buffer_len=L, device="cpu"))
    first, second = make().layer(0), make().layer(0)
    init = torch.randn(first.state.shape, generator=torch.Generator().manual_seed(1))
    first.state.copy_(init)
    second.state.copy_(init)
    return first, second


def test_gdn_cpu_dispatch_is_the_reference():
    gen = torch.Generator().manual_seed(0)
    layer, mirror = _caches("gdn")
    idx = torch.tensor([4, -1, 1], dtype=torch.int32)
    for _ in range(2 * L + 1):
        x = _gdn_step(gen)
        out = gdn_ops.replay_decode(layer, **x, state_batch_indices=idx, mode="auto")
        ref_out = torch.zeros_like(out)
        gdn_ref.replay_step_(mirror.state, mirror.u_ring, mirror.k_ring, mirror.g_ring, mirror.cursor, x["q"], x["k"],
                             x["v"], x["a"], x["b"], x["A_log"], x["dt_bias"], None, idx, -1, False, ref_out)
        assert torch.equal(out[[0, 2]], ref_out[[0, 2]])
        for name, t in layer.tensors().items():
            if name != "arrive":
                assert torch.equal(t, getattr(mirror, name)), name
    pool = layer.state.clone()
    out = gdn_ops.state_update(pool, **_gdn_step(gen), state_batch_indices=idx)
    assert out.shape == (BATCH, HV, V) and not torch.equal(pool, layer.state)


def test_kda_cpu_dispatch_is_the_reference():
    gen = torch.Generator().manual_seed(1)
    layer, mirror = _caches("kda")
    idx = torch.tensor([0, 3, -1], dtype=torch.int32)
    for _ in range(2 * L + 1):
        x = _kda_step(gen)
        out = kda_ops.replay_decode(layer, **x, state_batch_indices=idx)
        ref_out = torch.zeros_like(out)
        kda_ref.replay_step_(mirror.state, mirror.u_ring, mirror.k_ring, mirror.g_ring, mirror.cursor, x["q"], x["k"],
                             x["v"], x["g"], x["beta"], x["A_log"], x["dt_bias"], -5.0, None, idx, -1, False, ref_out)
        assert torch.equal(out[:2], ref_out[:2])
        for name, t in layer.tensors().items():
            if name != "arrive":
                assert torch.equal(t, getattr(mirror, name)), name
    pool = layer.state.clone()
    y = kda_ops.state_update(pool, **_kda_step(gen), state_batch_indices=idx, scale=0.5)
    assert torch.isfinite(y[:2].float()).all() and not torch.equal(pool, layer.state)


def test_gdn_bad_input_errors_name_the_argument():
    gen = torch.Generator().manual_seed(2)
    layer, _ = _caches("gdn")
    x = _gdn_step(gen)
    with pytest.raises(ValueError, match=r"^q: expected shape \[\*, \*, 64\]"):
        gdn_ops.replay_decode(layer, **{**x, "q": x["q"][..., :32]})
    with pytest.raises(ValueError, match=r"^q: key heads \(dim 1\) must divide"):
        gdn_ops.replay_decode(layer, **{**x, "q": x["q"][:, :1].expand(BATCH, 3, K).contiguous(),
                                         "k": x["k"][:, :1].expand(BATCH, 3, K).contiguous()})
    with pytest.raises(TypeError, match=r"^k: expected the dtype of q \(torch.bfloat16\), got"):
        gdn_ops.replay_decode(layer, **{**x, "k": x["k"].half()})
    with pytest.raises(TypeError, match=r"^A_log: expected dtype"):
        gdn_ops.replay_decode(layer, **{**x, "A_log": x["A_log"].double()})
    with pytest.raises(ValueError, match=r"^dt_bias: expected shape \[4\]"):
        gdn_ops.replay_decode(layer, **{**x, "dt_bias": torch.zeros(3)})
    with pytest.raises(TypeError, match=r"^a: expected the dtype of q \(torch.bfloat16\) or torch.float32, got"):
        gdn_ops.replay_decode(layer, **{**x, "a": x["a"].half()})
    with pytest.raises(ValueError, match=r"^state_batch_indices: values must be in \[0, 5\)"):
        gdn_ops.replay_decode(layer, **x, state_batch_indices=torch.tensor([0, 1, 7], dtype=torch.int32))
    with pytest.raises(ValueError, match=r"^mode:"):
        gdn_ops.replay_decode(layer, **x, mode="fast")
    with pytest.raises(TypeError, match=r"^scale: expected a float"):
        gdn_ops.replay_decode(layer, **x, scale="0.1")
    with pytest.raises(ValueError, match=r"^scale: expected a finite float"):
        gdn_ops.replay_decode(layer, **x, scale=float("nan"))
    with pytest.raises(TypeError, match=r"^layer: expected a GDNLayerCache, got KDALayerCache"):
        gdn_ops.replay_decode(_caches("kda")[0], **x)
    bad_state = torch.zeros(SLOTS, HV, V, 96)
    with pytest.raises(ValueError, match=r"^state: key dim \(last dim\) must be one of \(64, 128, 256\), got 96"):
        gdn_ops.state_update(bad_state, **x)
    with pytest.raises(ValueError, match=r"^layer.g_ring: expected shape"):
        layer.g_ring = torch.zeros(SLOTS, HV, L, K)
        gdn_ops.replay_decode(layer, **x)


def test_kda_bad_input_errors_name_the_argument():
    gen = torch.Generator().manual_seed(3)
    layer, _ = _caches("kda")
    x = _kda_step(gen)
    with pytest.raises(ValueError, match=r"^lower_bound: expected a finite negative"):
        kda_ops.replay_decode(layer, **{**x, "lower_bound": 1.0})
    with pytest.raises(ValueError, match=r"^g: expected shape \[3, 4, 64\]"):
        kda_ops.replay_decode(layer, **{**x, "g": x["g"][:, :, :1]})
    with pytest.raises(ValueError, match=r"^dt_bias: expected shape \[4, 64\]"):
        kda_ops.replay_decode(layer, **{**x, "dt_bias": torch.zeros(HV, 32)})
    with pytest.raises(TypeError, match=r"^beta: expected the dtype of q \(torch.bfloat16\) or torch.float32, got"):
        kda_ops.replay_decode(layer, **{**x, "beta": x["beta"].half()})
    with pytest.raises(ValueError, match=r"^v: expected shape"):
        kda_ops.state_update(layer.state, **{**x, "v": x["v"][:, :, :16]})
    with pytest.raises(TypeError, match=r"^layer: expected a KDALayerCache"):
        kda_ops.replay_decode(_caches("gdn")[0], **x)
    # a flat [HV*K] dt_bias is accepted, as in the reference
    kda_ops.replay_decode(layer, **{**x, "dt_bias": torch.zeros(HV * K)})


# Largest row tile of each key dim the launch heuristic can pick (most registers per thread).
COMPILE_CASES = [(kda, K_, tile, sdt) for kda in (False, True) for K_, tile in ((128, 64), (256, 32), (64, 64))
                 for sdt in (torch.float32, torch.bfloat16)]


@pytest.mark.parametrize("arch", SUPPORTED_ARCHS)
def test_delta_rule_configs_compile_without_spills(arch, tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_REPLAYSSM_CACHE", str(tmp_path))
    cases = COMPILE_CASES if arch == "sm_90a" else [c for c in COMPILE_CASES if c[1] == 128]
    for kda, key_dim, tile, state_dtype in cases:
        config = delta.kernel_config(kda, key_dim, 128, state_dtype, torch.bfloat16, tile)
        log = compile_config(config, arch).log
        usage = resource_usage(log)
        assert {u.kernel for u in usage} == set(config.kernels), log
        assert "bytes spill" in log
        for u in usage:
            print(f"{arch} {config.name} {u.kernel}: {u.registers} registers, {u.spill_bytes} B spills")
            assert u.spill_bytes == 0 and u.stack_bytes == 0, (config.name, u)
