"""The accuracy harness: KL / perplexity on known distributions, segment summaries, and `trtllm-replayssm accuracy`
end to end on a tiny random preset (CPU)."""
from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trtllm_replayssm.core.formats import state_spec
from trtllm_replayssm.lab.accuracy import (AccuracyConfig, kl_curve, read_tokens, run_accuracy, segment_records,
                                           token_metrics)


def test_identical_logits_have_zero_kl_and_full_agreement() -> None:
    logits = torch.randn(7, 256, generator=torch.Generator().manual_seed(0))
    targets = torch.arange(7)
    kl, nll_ref, nll_test, agree = token_metrics(logits, logits.clone(), targets)
    assert kl.abs().max().item() < 1e-12 and agree.all()
    assert torch.equal(nll_ref, nll_test)
    assert torch.allclose(nll_ref, -torch.log_softmax(logits.double(), -1)[torch.arange(7), targets])


def test_kl_of_two_categoricals_matches_the_closed_form() -> None:
    f64 = torch.float64
    p, q = torch.tensor([0.5, 0.25, 0.25], dtype=f64), torch.tensor([0.25, 0.5, 0.25], dtype=f64)
    kl, nll_ref, nll_test, agree = token_metrics(p.log()[None], q.log()[None], torch.tensor([1]))
    want = 0.5 * math.log(2.0) + 0.25 * math.log(0.5)  # sum p log(p / q)
    assert kl.item() == pytest.approx(want, rel=1e-12)
    assert nll_ref.item() == pytest.approx(math.log(4.0)) and nll_test.item() == pytest.approx(math.log(2.0))
    assert not agree.item()


def test_segments_and_perplexity() -> None:
    kl = torch.tensor([0.0, 1.0, 2.0, 3.0], dtype=torch.float64)
    nll = torch.full((4,), math.log(3.0), dtype=torch.float64)
    agree = torch.tensor([True, False, True, True])
    first, second = segment_records(kl, nll, nll * 2, agree, first=10, positions=[12, 14])
    assert (first["from_position"], first["position"], first["predicted_tokens"]) == (10, 12, 2)
    assert first["mean_kl"] == pytest.approx(0.5) and second["mean_kl"] == pytest.approx(2.5)
    assert first["ppl_ref"] == pytest.approx(3.0) and first["ppl"] == pytest.approx(9.0)
    assert first["delta_ppl_pct"] == pytest.approx(200.0)
    assert (first["greedy_agreement"], second["greedy_agreement"]) == (0.5, 1.0)
    assert second["p99_kl"] == pytest.approx(2.99)
    assert kl_curve(kl, first=10, bins=2) == {"position": [12, 14], "mean_kl": [0.5, 2.5]}


def test_config_positions_and_tokens() -> None:
    cfg = AccuracyConfig("tiny-nemotron", state_spec("bf16"), tokens=5000, positions=(8, 4096, 32768))
    assert cfg.report_positions == (4096, 5000)
    with pytest.raises(ValueError, match="tokens: expected more than prompt_len"):
        AccuracyConfig("tiny-nemotron", state_spec("fp32"), tokens=16)
    assert read_tokens(4, seed=1).tolist() == read_tokens(4, seed=1).tolist()


def _cli(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "trtllm_replayssm", "accuracy", *args], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("state, same", [(["--state-format", "fp32"], True), (["--state-format", "bf16"], False)])
def test_accuracy_command_end_to_end(tmp_path: Path, state: list[str], same: bool) -> None:
    text = tmp_path / "text.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                    "must be in want of a wife. “However little known” — " * 4)
    r = _cli(tmp_path, "tiny-nemotron", *state, "--tokens", "200", "--text", str(text), "--positions", "100",
             "--device", "cpu", "-o", "out/acc.json")
    assert r.returncode == 0, r.stdout + r.stderr
    doc = json.loads((tmp_path / "out" / "acc.json").read_text())
    first, last = doc["records"]
    assert (first["from_position"], first["position"], last["position"]) == (16, 100, 200)
    for rec in doc["records"]:
        assert rec["kind"] == "accuracy" and rec["model"] == "tiny-nemotron" and rec["spec_tokens"] == 1
        assert {"state_format", "state_mode", "master_format", "stochastic_rounding", "mean_kl", "p99_kl", "ppl",
                "ppl_ref", "greedy_agreement"} <= set(rec)
        if same:  # fp32 replay is the fp32 baseline up to float error
            assert rec["mean_kl"] < 1e-9 and rec["greedy_agreement"] == 1.0
            assert rec["ppl"] == pytest.approx(rec["ppl_ref"], rel=1e-6)
        else:
            assert 1e-9 < rec["mean_kl"] < 1e-1 and rec["p99_kl"] >= rec["mean_kl"]
    assert (tmp_path / "out" / "acc.png").is_file() or "matplotlib" in r.stdout
    assert "greedy agreement" in r.stdout


def test_states_share_one_reference_pass(tmp_path: Path) -> None:
    """--states decodes each listed state against one fp32 baseline pass: each state's records equal its own run."""
    text = tmp_path / "text.txt"
    text.write_text("Persuasion, a novel; the sea and the navy and Anne Elliot. " * 6)
    common = ["tiny-nemotron", "--tokens", "180", "--text", str(text), "--positions", "90", "--device", "cpu"]
    r = _cli(tmp_path, *common, "--states", "fp32, bf16", "-o", "suite.json")
    assert r.returncode == 0, r.stdout + r.stderr
    suite = json.loads((tmp_path / "suite.json").read_text())
    assert [rec["label"] for rec in suite["records"]] == ["fp32", "fp32", "bf16", "bf16"]
    assert set(suite["kl_curve"]) == {"fp32", "bf16"}
    r = _cli(tmp_path, *common, "--state-format", "bf16", "-o", "single.json")
    assert r.returncode == 0, r.stdout + r.stderr
    single = json.loads((tmp_path / "single.json").read_text())
    assert suite["records"][2:] == single["records"]
    assert max(rec["mean_kl"] for rec in suite["records"][:2]) < 1e-9 < min(rec["mean_kl"] for rec in single["records"])
    ids = read_tokens(40, seed=1)
    configs = [AccuracyConfig("tiny-nemotron", state_spec(s), tokens=40, device="cpu", prompt_len=p)
               for s, p in (("fp32", 8), ("bf16", 9))]
    with pytest.raises(ValueError, match="configs: every config shares the reference pass"):
        run_accuracy(configs, ids)


@pytest.mark.parametrize("model", ["tiny-nemotron", "tiny-qwen"])
def test_speculative_windows_equal_standard_decode(tmp_path: Path, model: str) -> None:
    """fp32 state, windows of 4 tokens committing a seeded 1..4 of them (mean 2.5): every token's distribution
    equals the fp32 baseline's up to float error; a bf16 state under the same windows differs."""
    ids = read_tokens(120, seed=2)
    for state, same in (("fp32", True), ("bf16", False)):
        cfg = AccuracyConfig(model, state_spec(state), tokens=120, prompt_len=8, positions=(60,), device="cpu",
                             spec_tokens=4, mean_accept=2.5)
        for rec in run_accuracy(cfg, ids)["records"]:
            assert rec["spec_tokens"] == 4 and rec["mean_accept"] == 2.5 and rec["label"].endswith("T=4 A=2.5")
            if same:
                assert rec["mean_kl"] < 1e-9 and rec["greedy_agreement"] == 1.0
            else:
                assert rec["mean_kl"] > 1e-9


def test_speculative_config_is_checked() -> None:
    with pytest.raises(ValueError, match=r"^mean_accept: expected 1 <= A <= spec_tokens = 4, got None"):
        AccuracyConfig("tiny-nemotron", state_spec("fp32"), tokens=64, spec_tokens=4)
    with pytest.raises(ValueError, match=r"^spec_tokens: the speculative verify reads plain checkpoints"):
        AccuracyConfig("tiny-nemotron", state_spec("nvfp4", "dual", "fp32"), tokens=64, spec_tokens=4,
                       mean_accept=2.0)
    with pytest.raises(ValueError, match=r"^mean_accept: only with spec_tokens > 1"):
        AccuracyConfig("tiny-nemotron", state_spec("fp32"), tokens=64, mean_accept=2.0)


@pytest.mark.parametrize("args, message", [
    (["--tokens", "0"], "error: --tokens: expected more than prompt_len"),
    (["--tokens", "64", "--spec", "4"], "error: --mean-accept: expected 1 <= A <= spec_tokens = 4"),
    (["--tokens", "64", "--spec", "9", "--mean-accept", "2"], "error: --spec: expected 1..8 tokens per window"),
    (["--tokens", "64", "--text", "short.txt"], "error: --tokens: 'short.txt' holds only 5 byte tokens"),
    (["--tokens", "64", "--state-format", "nvfp4", "--state-mode", "plain"], "error: --state-mode: plain keeps"),
    (["--tokens", "64", "--positions", "0,5"], "error: --positions: expected comma-separated positive ints"),
    (["--tokens", "64", "--states", "fp32", "--state-format", "bf16"], "error: --states: give either --states"),
    (["--tokens", "64", "--states", "fp32,nvfp4/shared"], "error: --states: expected FORMAT or FORMAT/dual/MASTER"),
])
def test_accuracy_command_rejects_bad_input(tmp_path: Path, args: list[str], message: str) -> None:
    (tmp_path / "short.txt").write_text("short")
    r = _cli(tmp_path, "tiny-nemotron", *args)
    assert r.returncode == 2 and r.stderr.strip().startswith(message), r.stderr


def test_accuracy_command_rejects_an_unknown_model(tmp_path: Path) -> None:
    r = _cli(tmp_path, "no-such-model", "--tokens", "64")
    assert r.returncode == 2 and r.stderr.startswith("error: MODEL: "), r.stderr


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("spec_tokens, mean_accept", [(1, None), (4, 2.5)])
def test_graphed_steps_equal_eager_steps(spec_tokens: int, mean_accept: float | None) -> None:
    """The decode steps (and speculative windows) replayed from CUDA graphs give the eager run's report, and passes
    overlapping on their own streams the serial passes' report."""
    ids = read_tokens(200, seed=3)
    docs = [run_accuracy([AccuracyConfig("tiny-qwen", state_spec(s), tokens=200, positions=(100,), device="cuda",
                                         spec_tokens=spec_tokens, mean_accept=mean_accept, use_graph=graph)
                          for s in ("bf16", "fp32")], ids, overlap=overlap)
            for graph, overlap in ((False, False), (True, False), (True, True))]
    assert docs[0]["records"] == docs[1]["records"] == docs[2]["records"]
