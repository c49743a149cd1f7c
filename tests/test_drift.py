"""The drift study (`trtllm-replayssm bench drift`, `lab/drift.py`) on the CPU references: a short run whose errors
order as the formats do, and its checks."""
from __future__ import annotations

import pytest
import torch

from trtllm_replayssm.core.formats import parse_state_label
from trtllm_replayssm.lab.drift import DriftConfig, plot_drift, run_drift


def test_config_checks():
    with pytest.raises(ValueError, match=r"^state_every: expected a multiple of buffer_len"):
        DriftConfig(model="tiny-nemotron", steps=64, state_every=24)
    with pytest.raises(ValueError, match=r"^specs: unknown state format 'fp9'"):
        DriftConfig(model="tiny-nemotron", specs=("fp9",))


def test_short_run_orders_the_formats(tmp_path):
    specs = ("fp32", "bf16", "fp8", "nvfp4", "nvfp4/dual/fp32")
    doc = run_drift(DriftConfig(model="tiny-nemotron", specs=specs, steps=64, batch=2, state_every=16), "cpu")
    recs = {r["label"]: r for r in doc["records"]}
    assert list(recs) == list(specs)
    for r in recs.values():
        assert r["kind"] == "drift" and r["state_steps"] == [16, 32, 48, 64]
        assert len(r["state_rel_err"]) == len(r["output_rel_err_median"]) == len(r["output_rel_err_max"]) == 4
    last = {k: r["state_rel_err"][-1] for k, r in recs.items()}
    assert last["fp32"] < 1e-5 < last["bf16"] < 1e-2 < last["fp8"] < 5e-2 < last["nvfp4"] < 0.2
    # an fp32 master folds exactly what a plain fp32 checkpoint folds; only the read-outs see the NVFP4 read copy
    assert recs["nvfp4/dual/fp32"]["state_rel_err"] == recs["fp32"]["state_rel_err"]
    out = {k: max(r["output_rel_err_median"]) for k, r in recs.items()}
    assert out["fp32"] < 1e-2 < out["nvfp4/dual/fp32"] and out["fp32"] < out["bf16"]
    plot_drift(doc, tmp_path / "drift.png")
    assert (tmp_path / "drift.png").stat().st_size > 0


def test_delta_rule_drift_on_the_cpu(tmp_path):
    """GDN with a dual NVFP4 read copy: the read copy's error reaches the master through u (docs/design.md), so the
    dual master is no longer the plain one's; the CLI runs it on the CPU and writes JSON and plot."""
    from click.testing import CliRunner

    from trtllm_replayssm.cli import main

    out = tmp_path / "drift.json"
    r = CliRunner().invoke(main, ["bench", "drift", "--model", "tiny-qwen", "--device", "cpu", "--specs",
                                  "fp32,nvfp4/dual/fp32,nvfp4", "--steps", "32", "--state-every", "16", "--batch",
                                  "2", "-o", str(out)])
    assert r.exit_code == 0, r.output
    recs = {rec["label"]: rec for rec in __import__("json").loads(out.read_text())["records"]}
    assert recs["fp32"]["family"] == "gdn" and out.with_suffix(".png").exists()
    fp32, dual, shared = (recs[k]["state_rel_err"][-1] for k in ("fp32", "nvfp4/dual/fp32", "nvfp4"))
    assert fp32 < 1e-2 < shared and fp32 < dual < shared  # bf16 u and k rings: GDN's fp32 floor is ~2e-3


def test_cli_checks_before_running():
    from click.testing import CliRunner

    from trtllm_replayssm.cli import main

    bad = CliRunner().invoke(main, ["bench", "drift", "--specs", "fp8/shared/fp32"])
    assert bad.exit_code == 2 and "--specs: expected FORMAT or FORMAT/dual/MASTER" in bad.output
    if not torch.cuda.is_available():
        no_gpu = CliRunner().invoke(main, ["bench", "drift", "--steps", "32", "--state-every", "16"])
        assert no_gpu.exit_code == 1 and "needs a CUDA GPU" in no_gpu.output


@pytest.mark.parametrize("label", ["fp32", "bf16", "fp16+sr", "fp8", "nvfp4+sr", "fp8/dual/fp32", "nvfp4/dual/fp8",
                                   "nvfp4/dual/fp16+sr"])
def test_state_labels_round_trip(label):
    assert parse_state_label(label).label == label


def test_state_label_errors():
    with pytest.raises(ValueError, match=r"^state: expected FORMAT or FORMAT/dual/MASTER"):
        parse_state_label("nvfp4/dual")
    with pytest.raises(ValueError, match=r"^master_format: expected one of"):
        parse_state_label("nvfp4/dual/nvfp4")
    with pytest.raises(ValueError, match=r"^stochastic_rounding: an fp32 checkpoint has no rounded writes"):
        parse_state_label("fp32+sr")
