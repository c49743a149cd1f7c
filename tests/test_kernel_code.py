"""CPU: what the NVRTC front end emits for the state kernels (PTX), where ptxas does not always repair it: the GDN/KDA
baseline, flush and one-launch replay kernels write each warp's fp32 state rows with one 16-byte vector store per
lane and row (docs/decisions.md, vector state stores: scalar stores cost the flush kernel 2.4x the ideal L2 sectors)."""
import re

import pytest
import torch

from trtllm_replayssm.core.jit.compiler import compile_ptx
from trtllm_replayssm.core.layouts import VERIFY_WINDOW_BUCKETS
from trtllm_replayssm.core.limits import NUM_WARPS
from trtllm_replayssm.core.ops import conv, delta, mamba2


def _entry(ptx: str, name: str) -> str:
    """The PTX body of entry ``name``: up to the next entry (inline assembly may close its own braces at column 0)."""
    start = ptx.index(f".entry {name}(")
    following = re.compile(r"^\.(?:visible|weak|extern) \.entry ", re.M).search(ptx, start + 1)
    return ptx[start:following.start() if following else len(ptx)]


@pytest.mark.parametrize(("per_channel_gate", "rows_per_cta"), [(False, 64), (True, 32)])
def test_delta_state_kernels_store_rows_in_16_byte_vectors(per_channel_gate, rows_per_cta):
    config = delta.kernel_config(per_channel_gate, 128, 128, torch.float32, torch.bfloat16, rows_per_cta)
    ptx = compile_ptx(config, "sm_90a")
    rows_per_warp = rows_per_cta // NUM_WARPS  # K = 128: one 16-byte chunk of 4 fp32 per lane and row
    for kind in ("state", "flush", "fused"):
        body = _entry(ptx, delta.DECODE_KERNELS[kind])
        assert body.count("st.global.v4.u32") >= rows_per_warp, kind


@pytest.mark.parametrize(("family", "config"), [
    (delta, lambda: delta.kernel_config(False, 128, 128, torch.float32, torch.bfloat16, 16)),
    (delta, lambda: delta.kernel_config(True, 128, 128, torch.float32, torch.bfloat16, 32)),
    (mamba2, lambda: mamba2.kernel_config(64, 128, torch.float32, torch.bfloat16, 8)),
    (mamba2, lambda: mamba2.kernel_config(64, 128, torch.float32, torch.bfloat16, 64)),
])
def test_state_kernels_read_nothing_the_kernel_before_writes_until_they_wait(family, config):
    """Programmatic state kernels, the Mamba-2 streaming one-launch replay (whole-head modules) and the one-launch
    Mamba-2 verify (rssm::wait_previous_grid): before ``griddepcontrol.wait`` the only global load is the guessed
    slot id, read around L1 (``ld.global.cg``; the rest are prefetch hints), and the next kernel may launch only after
    the wait."""
    built = config()
    ptx = compile_ptx(built, "sm_90a")
    kernels = [family.KERNELS[kind] for kind in ("state", "flush", "fused")]
    if family is mamba2:
        kernels += [family.SPEC_KERNELS[f"verify_one_launch_t{t}"] for t in VERIFY_WINDOW_BUCKETS]
        if family.KERNELS["fused_stream"] in built.kernels:
            kernels.append(family.KERNELS["fused_stream"])
    for kind in kernels:
        body = _entry(ptx, kind)
        wait = body.index("griddepcontrol.wait")
        assert body.index("griddepcontrol.launch_dependents") > wait, kind
        loads = re.findall(r"\bld\.global[.\w]*", body[:wait])
        assert loads and all(".cg" in load for load in loads), (kind, loads)
        assert "prefetch.global.L2" in body[:wait], kind



@pytest.mark.parametrize("act_dtype", [torch.bfloat16, torch.float16, torch.float32])
def test_the_conv_step_lets_its_dependents_launch_before_anything_else(act_dtype):
    """The conv1d decode step (core/ops/conv.py) executes ``griddepcontrol.launch_dependents`` before its first
    global memory access, so a state kernel launched as its programmatic dependent starts while it runs."""
    ptx = compile_ptx(conv.conv_config(act_dtype), "sm_90a")
    body = _entry(ptx, "conv1d_update_kernel")
    trigger = body.index("griddepcontrol.launch_dependents")
    assert not re.search(r"\b(?:ld|st)\.global", body[:trigger])
    assert "griddepcontrol.wait" not in body  # launched plainly: nothing before it to wait for
