"""The Python / CUDA seam: each parameter struct written once, the kernels' C++ struct and the launch's ctypes struct
both generated from it; the stage / fold / record sizes the host uses pinned against the kernels at compile time."""
import ctypes
import dataclasses
from pathlib import Path

import pytest
import torch

from trtllm_replayssm.core import layouts
from trtllm_replayssm.core.jit.compiler import KernelCompileError, compile_config, program_headers
from trtllm_replayssm.core.ops import delta, mamba2

ARCH = "sm_90a"
REPO = Path(__file__).resolve().parents[1]


def test_structs_follow_their_layouts():
    m = layouts.MAMBA2_PARAMS.struct
    assert [f for f, _ in m._fields_][:3] == ["state", "x_ring", "dt_ring"]
    assert ctypes.sizeof(m) == 26 * 8 + 29 * 8 + 17 * 4 + 4  # 26 pointers, 29 strides, 17 ints, pad
    d = layouts.DELTA_PARAMS.struct
    assert ctypes.sizeof(d) == 25 * 8 + 24 * 8 + 2 * 4 + 18 * 4  # 25 pointers, 24 strides, 2 floats, 18 ints
    assert d.scale.offset == 25 * 8 + 24 * 8
    assert layouts.DELTA_PARAMS.fields[-7:] == (("batch", "int"), ("stages", "int"), ("stage_bytes", "int"),
                                                ("fold_bytes", "int"), ("tail_start", "int"), ("flush_apart", "int"),
                                                ("l2_hints", "int"))


def test_pack_names_every_field():
    with pytest.raises(KeyError, match=r"missing fields \['tail_start'\]"):
        values = {f: 0 for f, _ in layouts.MAMBA2_PARAMS.fields if f != "tail_start"}
        layouts.MAMBA2_PARAMS.pack(**values)
    with pytest.raises(KeyError, match=r"unknown fields \['nope'\]"):
        layouts.MAMBA2_PARAMS.pack(**{f: 0 for f, _ in layouts.MAMBA2_PARAMS.fields}, nope=1)


def test_the_kernels_compile_the_struct_the_launch_fills():
    """The kernels declare no parameter struct of their own: they include the one generated from the layout."""
    for layout, source in ((layouts.MAMBA2_PARAMS, "mamba2_decode.cu"), (layouts.DELTA_PARAMS, "delta_rule_decode.cu")):
        text = (REPO / "plugins" / source).read_text()
        assert f"struct {layout.name} " not in text and f'#include "{layout.header_name}"' in text
        header = layout.header()
        assert f"struct {layout.name} {{" in header and f"sizeof({layout.name}) == {ctypes.sizeof(layout.struct)}" \
            in header
    config = mamba2.kernel_config(64, 128, torch.float32, torch.bfloat16, 16)
    assert program_headers(config) == {b"Mamba2Params.h": layouts.MAMBA2_PARAMS.header().encode()}


def test_a_layout_the_kernels_do_not_match_fails_the_compilation(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_REPLAYSSM_CACHE", str(tmp_path))
    config = mamba2.kernel_config(64, 128, torch.float32, torch.bfloat16, 16)
    renamed = layouts.ParamLayout("Mamba2Params", layouts.MAMBA2_PARAMS.body.replace("tail_start", "tail_begin"))
    with pytest.raises(KernelCompileError, match="tail_start"):
        compile_config(dataclasses.replace(config, layouts=(renamed,)), ARCH)
    with pytest.raises(ValueError, match="Broken: member type .int a. has no ctypes kind"):
        _ = layouts.ParamLayout("Broken", "  int a b;").fields


def test_a_wrong_stage_size_fails_the_kernel_compilation(tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_REPLAYSSM_CACHE", str(tmp_path))
    config = delta.kernel_config(True, 128, 128, torch.float32, torch.bfloat16, 32)
    wrong = layouts.delta_size_checks(32, 128, 512, 2, 2, per_channel_gate=False)  # GDN's sizes for a KDA kernel
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
    assert layouts.mamba2_stage_bytes(16, 64, 128, 4 * 128, 2, 64) == 35456
    assert layouts.key_ring_dtype(torch.float16, True) == torch.float32
    assert layouts.key_ring_dtype(torch.float16, False) == torch.float16
