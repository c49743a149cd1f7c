"""The Python / CUDA seam: parameter structs generated from one layout each, checked against the kernels at
compile time (a field out of order fails compilation), and the stage / fold / record sizes pinned likewise."""
import ctypes
import dataclasses

import pytest
import torch

from trtllm_replayssm.core import layouts
from trtllm_replayssm.core.jit.compiler import KernelCompileError, compile_config
from trtllm_replayssm.core.ops import delta, mamba2

ARCH = "sm_90a"


def test_structs_follow_their_layouts():
    m = layouts.MAMBA2_PARAMS.struct
    assert [f for f, _ in m._fields_][:3] == ["state", "x_ring", "dt_ring"]
    assert ctypes.sizeof(m) == 18 * 8 + 21 * 8 + 12 * 4  # 18 pointers, 21 strides, 12 ints
    d = layouts.DELTA_PARAMS.struct
    assert ctypes.sizeof(d) == 17 * 8 + 21 * 8 + 2 * 4 + 13 * 4 + 4  # + 4 bytes of tail padding to 8
    assert d.scale.offset == 17 * 8 + 21 * 8


def test_pack_names_every_field():
    with pytest.raises(KeyError, match=r"missing fields \['tail_start'\]"):
        values = {f: 0 for f, _ in layouts.MAMBA2_PARAMS.fields if f != "tail_start"}
        layouts.MAMBA2_PARAMS.pack(**values)
    with pytest.raises(KeyError, match=r"unknown fields \['nope'\]"):
        layouts.MAMBA2_PARAMS.pack(**{f: 0 for f, _ in layouts.MAMBA2_PARAMS.fields}, nope=1)


def test_checks_pin_every_offset():
    text = layouts.DELTA_PARAMS.cpp_checks()
    assert text.count("static_assert") == len(layouts.DELTA_PARAMS.fields) + 1
    assert "__builtin_offsetof(DeltaParams, tail_start) == " in text


def _swapped(layout: layouts.ParamLayout, a: str, b: str) -> layouts.ParamLayout:
    fields = list(layout.fields)
    i, j = [k for k, (name, _) in enumerate(fields) if name in (a, b)]
    fields[i], fields[j] = fields[j], fields[i]
    return layouts.ParamLayout(layout.name, tuple(fields))


def test_a_field_out_of_order_fails_the_kernel_compilation(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_REPLAYSSM_CACHE", str(tmp_path))
    config = mamba2.kernel_config(64, 128, torch.float32, torch.bfloat16, 16)
    bad = _swapped(layouts.MAMBA2_PARAMS, "x_ring", "dt_ring")
    broken = dataclasses.replace(config, checks=lambda c: bad.cpp_checks())
    with pytest.raises(KernelCompileError, match=r"Mamba2Params\.x_ring: offset differs"):
        compile_config(broken, ARCH)
    ints = _swapped(layouts.DELTA_PARAMS, "stages", "tail_start")  # same kind, same size: only the order differs
    config = delta.kernel_config(False, 128, 128, torch.float32, torch.bfloat16, 8)
    with pytest.raises(KernelCompileError, match=r"DeltaParams\.stages: offset differs"):
        compile_config(dataclasses.replace(config, checks=lambda c: ints.cpp_checks()), ARCH)


def test_a_wrong_stage_size_fails_the_kernel_compilation(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_REPLAYSSM_CACHE", str(tmp_path))
    config = delta.kernel_config(True, 128, 128, torch.float32, torch.bfloat16, 32)
    wrong = layouts.delta_size_checks(32, 128, 4, 2, 2, per_channel_gate=False)  # GDN's sizes for a KDA kernel
    with pytest.raises(KernelCompileError, match="differs from core/layouts.py"):
        compile_config(dataclasses.replace(config, checks=lambda c: wrong), ARCH)


def test_shipped_checks_compile(tmp_path, monkeypatch):
    """The checks every shipped config carries hold (the kernel gate compiles all of them)."""
    monkeypatch.setenv("TRTLLM_REPLAYSSM_CACHE", str(tmp_path))
    config = mamba2.kernel_config(80, 128, torch.bfloat16, torch.bfloat16, 8)
    assert "stage_layout(32).bytes ==" in config.appended_source()
    compile_config(config, ARCH)


def test_record_and_stage_sizes_by_hand():
    # GDN, L = 16: 32 ring coefficients, one log-decay (padded to 4), q/k multipliers, k.q, beta
    assert layouts.delta_record_len(16, 128, False) == 32 + 4 + 4
    assert layouts.delta_record_len(16, 128, True) == 32 + 128 + 8  # KDA: per-channel log-decay, key form
    # Mamba-2 Super-120B fp32, 64-row tile, L = 16: tile 32768 + info 16 + coef 80 + x, z 128 each + C 256 + ring 2048
    assert layouts.mamba2_stage_bytes(16, 64, 128, 4, 2) == 35456
    assert layouts.key_ring_dtype(torch.float16, True) == torch.float32
    assert layouts.key_ring_dtype(torch.float16, False) == torch.float16
