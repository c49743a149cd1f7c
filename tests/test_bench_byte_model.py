"""Kernel-benchmark byte model , cold-L2 pool sizing, config checks, and report/plot generation.

Reports are generated from a synthetic records list built here (never written to benchmarks/results).
"""
from __future__ import annotations

import json

import pytest
import torch
from click.testing import CliRunner

from trtllm_replayssm.core import byte_model as core
from trtllm_replayssm.core.dims import Mamba2Dims
from trtllm_replayssm.lab.bench import byte_model as bm
from trtllm_replayssm.lab.bench import report
from trtllm_replayssm.lab.bench.kernels import KernelBenchConfig
from trtllm_replayssm.lab.bench.shapes import BenchShape, select_shapes, shape_from_preset
from trtllm_replayssm.lab.bench.timing import pools_for_cold_l2
from trtllm_replayssm.cli.bench_cmd import bench_cmd

MIB = 1 << 20
NH64 = BenchShape("nh64", Mamba2Dims(nheads=64, head_dim=64, d_state=128, n_groups=8))
BF16 = "bf16"


# ------------------------------------------------------------------------------------------------ hand-computed bytes
def test_mamba2_nh64_fp32_by_hand():
    # S = 64*64*128*4; record = x 64*64*2 + B 8*128*2 + dt 64*4; io = x + dt + B,C + y + index
    S, rec, io = 2 * MIB, 8192 + 2048 + 256, 8192 + 256 + 4096 + 8192 + 4
    d = NH64.dims
    assert core.state_bytes(d, "fp32") == S
    assert core.record_bytes(d, BF16) == rec
    assert core.io_bytes(d, BF16) == io
    assert core.baseline_bytes(d, "fp32", BF16) == 2 * S + io == 4215044
    # L = 16: read S, mean 7.5 ring entries, 15 appends per 16 steps, one S write per 16 steps
    assert core.replay_bytes(d, "fp32", BF16, 16) == pytest.approx(S + 7.5 * rec + rec * 15 / 16 + S / 16 + io)
    assert core.replay_bytes(d, "fp32", BF16, 16) == pytest.approx(2337524)


def test_gdn_and_kda_records_by_hand():
    qwen4b = shape_from_preset("qwen3.5-4b").dims  # H 16, HV 32, K = V = 128
    assert core.record_bytes(qwen4b, BF16) == 32 * 128 * 2 + 16 * 128 * 2 + 32 * 4
    assert core.io_bytes(qwen4b, BF16) == 2 * 16 * 128 * 2 + 32 * 128 * 2 + 32 * 2 + 32 * 2 + 32 * 128 * 2 + 4
    kimi = shape_from_preset("kimi-linear-48b").dims  # 32 heads x 128, per-channel fp32 gate ring
    assert core.record_bytes(kimi, BF16) == 32 * 128 * 2 + 32 * 128 * 2 + 32 * 128 * 4
    assert core.record_bytes(kimi, "fp16") == 32 * 128 * 2 + 32 * 128 * 4 + 32 * 128 * 4  # fp32 keys under fp16
    assert core.io_bytes(kimi, BF16) == 2 * 32 * 128 * 2 + 32 * 128 * 2 + 32 * 128 * 2 + 32 * 2 + 32 * 128 * 2 + 4
    assert core.state_bytes(kimi, "bf16") == 32 * 128 * 128 * 2
    # KDA's pre-decayed keys: a step reads the w entries' values and keys and one gate row (w >= 1), not w gate rows
    s, rec, gate_row, io = (core.state_bytes(kimi, "fp32"), core.record_bytes(kimi, BF16), 32 * 128 * 4,
                            core.io_bytes(kimi, BF16))
    expected = s + (rec - gate_row) * 15 / 2 + gate_row * 15 / 16 + rec * 15 / 16 + s / 16 + io
    assert core.replay_bytes(kimi, "fp32", BF16, 16) == pytest.approx(expected)
    assert core.replay_bytes(qwen4b, "fp32", BF16, 16) == pytest.approx(
        core.state_bytes(qwen4b, "fp32") * 17 / 16 + core.record_bytes(qwen4b, BF16) * (15 / 2 + 15 / 16)
        + core.io_bytes(qwen4b, BF16))


# (shape, state dtype, full ring / S, baseline MiB/step, replay MiB/step, ideal speed-up): the published ReplaySSM byte-model table at L = 16.
# The table also counts z (our model omits it: Nemotron gates in the norm) and reads L/2 ring entries on average
# (ours: exactly (L-1)/2 for cursors 0..L-1): agreement within 1.5%.
TABLE = [
    (NH64, "fp32", 0.080, 4.03, 2.24, 1.80),
    (NH64, "bf16", 0.160, 2.03, 1.18, 1.73),
    ("nemotron-3-super-120b", "fp32", 0.072, 8.05, 4.46, 1.81),
    ("nemotron-3-super-120b", "bf16", 0.145, 4.05, 2.33, 1.74),
    ("qwen3.5-4b", "fp32", 0.095, 4.02, 2.25, 1.79),
    ("qwen3.5-122b", "fp32", 0.079, 8.04, 4.46, 1.80),
    ("qwen3.5-122b", "bf16", 0.158, 4.04, 2.33, 1.73),
]


@pytest.mark.parametrize("shape,sd,ring,base,replay,speedup", TABLE)
def test_matches_peers_table(shape, sd, ring, base, replay, speedup):
    d = (shape if isinstance(shape, BenchShape) else shape_from_preset(shape)).dims
    assert 16 * core.record_bytes(d, BF16) / core.state_bytes(d, sd) == pytest.approx(ring, abs=0.0006)
    assert core.baseline_bytes(d, sd, BF16) / MIB == pytest.approx(base, rel=0.015)
    assert core.replay_bytes(d, sd, BF16, 16) / MIB == pytest.approx(replay, rel=0.015)
    assert core.step_bytes(d, sd, BF16, 16).speedup == pytest.approx(speedup, abs=0.011)


def test_replay_with_one_entry_ring_is_baseline():
    for model in ("nemotron-3-nano-4b", "qwen3.5-122b", "glm-5.3-flash"):
        d = shape_from_preset(model).dims
        assert core.replay_bytes(d, "bf16", BF16, 1) == core.baseline_bytes(d, "bf16", BF16)


def test_impl_formulas():
    d = NH64.dims
    S32, S16, io = core.state_bytes(d, "fp32"), core.state_bytes(d, "bf16"), core.io_bytes(d, BF16)
    rec = core.record_bytes(d, BF16)
    assert bm.step_bytes("replay", NH64, "fp32", 16, "flush") == 2 * S32 + io
    assert bm.step_bytes("replay", NH64, "fp32", 16, "replay") == core.replay_bytes(d, "fp32", BF16, 16)
    for impl in ("baseline", "flashinfer_ssu", "mamba_ssm_ssu", "fla_kda", "fla_gdn_pooled"):
        assert bm.step_bytes(impl, NH64, "bf16", 16) == 2 * S16 + io
    assert bm.step_bytes("fla_gdn", NH64, "bf16", 16) == S16 + S32 + io  # reads bf16, writes a new fp32 state
    # FlashInfer window 16: replayed count cycles 1..16 (mean 8.5), one append per step, one flush per 16 steps
    assert bm.step_bytes("flashinfer_checkpointing_ssu", NH64, "fp32", 16) == pytest.approx(
        S32 + 8.5 * rec + rec + S32 / 16 + io)


@pytest.mark.parametrize("call,match", [
    (lambda: bm.step_bytes("nope", NH64, "fp32", 16), "impl"),
    (lambda: bm.step_bytes("replay", NH64, "fp32", 16, "auto"), "mode"),
    (lambda: core.state_bytes(NH64.dims, "fp9"), "state_format"),
    (lambda: core.replay_bytes(NH64.dims, "fp32", BF16, 0), "buffer_len"),
    (lambda: bm.checkpointing_ssu_bytes(NH64, "fp32", 0), "window"),
])
def test_bad_inputs_name_the_argument(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_cold_l2_pools():
    l2 = 60 * 10**6  # H200
    assert pools_for_cold_l2(8 * MIB, l2) >= 4
    assert 29 * 8 * MIB > 4 * l2 and 28 * 8 * MIB <= 4 * l2
    assert pools_for_cold_l2(2 * 10**9, l2) == 4  # never fewer than 4
    with pytest.raises(ValueError, match="pool_bytes"):
        pools_for_cold_l2(0, l2)


def test_shapes_from_presets():
    nano = shape_from_preset("nemotron-3-nano-4b").dims
    assert (nano.heads, nano.rows, nano.cols, nano.key_heads) == (96, 80, 128, 8)
    q122 = shape_from_preset("qwen3.5-122b").dims
    assert (q122.heads, q122.rows, q122.cols, q122.key_heads) == (64, 128, 128, 16)
    assert [s.model for s in select_shapes(["kda"], None)] == ["kimi-linear-48b", "glm-5.3-flash"]
    with pytest.raises(ValueError, match="models"):
        select_shapes(["mamba2"], ["qwen3.5-4b"])
    with pytest.raises(ValueError, match="families"):
        select_shapes(["rwkv"], None)


def test_config_validation():
    with pytest.raises(ValueError, match="batches"):
        KernelBenchConfig(families=["mamba2"], batches=[0])
    with pytest.raises(ValueError, match="buffer_len"):
        KernelBenchConfig(families=["mamba2"], buffer_len=33)
    with pytest.raises(ValueError, match="replays"):
        KernelBenchConfig(families=["mamba2"], replays=5)
    assert len(KernelBenchConfig(families=["mamba2", "gdn"]).shapes) == 4


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA message")
def test_cli_without_cuda_exits_clearly():
    result = CliRunner().invoke(bench_cmd, ["kernels", "--quick"])
    assert result.exit_code == 1
    assert "needs a CUDA GPU" in result.output


def test_cli_rejects_bad_batch():
    result = CliRunner().invoke(bench_cmd, ["kernels", "--batch", "8,x"])
    assert result.exit_code == 2
    assert "comma-separated integers" in result.output


# ---------------------------------------------------------------------------------------------------------- reports
def _rec(impl: str, batch: int, us: float, mode: str | None = None, sd: str = "fp32") -> dict:
    return {"family": "mamba2", "model": "nemotron-3-super-120b", "impl": impl, "batch": batch, "state_dtype": sd,
            "L": 16, "median_us": us, "model_gbps": 1000.0, "pct_of_copy": 25.0, "mode": mode,
            "bytes_per_call": 1.0}


def _synthetic() -> dict:
    records = [
        _rec("replay", 1, 6.0, "replay"), _rec("replay", 1, 5.0, "flush"), _rec("replay", 1, 5.0, "auto"),
        _rec("baseline", 1, 5.0), _rec("flashinfer_ssu", 1, 4.0), _rec("flashinfer_checkpointing_ssu", 1, 8.0),
        _rec("replay", 256, 300.0, "replay"), _rec("baseline", 256, 540.0), _rec("flashinfer_ssu", 256, 600.0),
        _rec("flashinfer_checkpointing_ssu", 256, 330.0),
    ]
    return {"device": "synthetic", "date": "2026-01-01", "copy_ceiling_gbps": 4000.0, "buffer_len": 16,
            "peer_versions": {"flashinfer-python": "x"}, "records": records,
            "skipped": [{"impl": "mamba_ssm_ssu", "model": "nemotron-3-super-120b", "state_dtype": "fp32",
                         "batch": 1, "reason": "not installed"}]}


def test_speedups_use_auto_mode_and_best_peer():
    rows = {r["batch"]: r for r in report.speedups(_synthetic())}
    assert rows[1]["replay_us"] == 5.0  # auto, not the forced replay mode
    assert rows[1]["vs_baseline"] == pytest.approx(1.0)
    assert rows[1]["vs_best_peer"] == pytest.approx(0.8) and rows[1]["best_peer"] == "flashinfer_ssu"
    assert rows[256]["vs_baseline"] == pytest.approx(1.8)
    assert rows[256]["vs_best_peer"] == pytest.approx(1.1) and rows[256]["best_peer"] == "flashinfer_checkpointing_ssu"


def test_markdown_and_plot(tmp_path):
    results = _synthetic()
    md = report.summary_markdown(results)
    assert "## nemotron-3-super-120b (mamba2), fp32 state" in md
    assert "| replay/auto | 5.0 (25%) | — |" in md
    assert "| **speed-up vs baseline** | 1.00× | 1.80× |" in md
    assert "1.10× (flashinfer_checkpointing_ssu)" in md
    assert "mamba_ssm_ssu nemotron-3-super-120b fp32 b=1: not installed" in md
    jp, mdp, png = report.write_reports(results, tmp_path / "r.json")
    assert json.loads(jp.read_text())["records"] == results["records"]
    assert report.load_results(jp)["device"] == "synthetic"
    assert mdp.read_text() == md
    assert png is not None and png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_validate_results_names_missing_keys():
    bad = _synthetic()
    del bad["copy_ceiling_gbps"]
    with pytest.raises(ValueError, match="copy_ceiling_gbps"):
        report.validate_results(bad)
    bad = _synthetic()
    del bad["records"][0]["median_us"]
    with pytest.raises(ValueError, match=r"records\[0\].*median_us"):
        report.validate_results(bad)
