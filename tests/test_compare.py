"""`compare` end to end on a tiny CPU model: JSON fields, PNG, table; trtllm-bench command lines."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from trtllm_replayssm.lab import compare
from trtllm_replayssm.lab.compare import CompareSettings, run_compare, speedups, trtllm_bench_commands

TINY = {
    "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", "vocab_size": 64, "hidden_size": 32,
    "hybrid_override_pattern": "M*M-",
    "mamba_num_heads": 4, "mamba_head_dim": 8, "ssm_state_size": 32, "n_groups": 2, "conv_kernel": 4,
    "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8, "intermediate_size": 48,
}


@pytest.fixture()
def tiny_config(tmp_path):
    path = tmp_path / "tiny-nemotron" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(TINY))
    return path


def test_run_compare_writes_records_checks_and_plot(tmp_path, tiny_config) -> None:
    settings = CompareSettings(batches=(1, 2), steps=6, buffer_len=2, prompt_len=3, device="cpu",
                               replay_mode="replay")
    report = run_compare([str(tiny_config)], settings, tmp_path / "out")
    on_disk = json.loads((tmp_path / "out" / "compare.json").read_text())
    assert on_disk["records"] == report["records"] and {"device", "date", "records", "engine"} <= on_disk.keys()
    assert on_disk["device"].startswith("cpu") and "reference decoder" in on_disk["engine"]
    recs = on_disk["records"]
    assert len(recs) == 4
    for r in recs:
        assert r["kind"] == "decode_step" and r["model"] == "tiny-nemotron" and r["layers"] == "all"
        assert r["impl"] in ("baseline", "replay") and r["batch"] in (1, 2)
        assert r["state_dtype"] == "fp32" and r["L"] == 2
        assert r["median_step_us"] > 0 and r["ssm_median_us"] > 0
        # the SSM ops are part of the step: timed alone they take a share of it. Two separate CPU timings, so the
        # share may pass 1 on a busy machine, but not by 3x (a unit or probe mistake would: ms vs us is 1000x)
        assert 0.01 < r["ssm_share"] < 3.0 and r["ssm_median_us"] < 3.0 * r["median_step_us"]
    assert all(c["tokens_equal"] and c["mismatch_rows"] == 0 and c["max_abs_dlogits"] < 1e-4 and c["flush_cycles"] == 3
               for c in on_disk["checks"])
    assert len(speedups(recs)) == 2
    png = (tmp_path / "out" / "compare_speedup.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"


def test_each_implementation_runs_twice_in_mirrored_order(tmp_path, tiny_config, monkeypatch) -> None:
    """A B B A per batch: the progress events name the runs in that order, each run decodes every step."""
    settings = CompareSettings(batches=(2,), steps=6, buffer_len=2, prompt_len=3, device="cpu")
    model, _ = compare.load_model(str(tiny_config), settings)
    seen: list[tuple[int, str]] = []
    steps_run: dict[str, int] = {}
    decode = compare._decode

    def counting_decode(*args, **kwargs):
        run, time_ssm = decode(*args, **kwargs)
        steps_run[args[1]] = steps_run.get(args[1], 0) + len(run.step_us)
        return run, time_ssm

    monkeypatch.setattr(compare, "_decode", counting_decode)
    records, checks = compare.measure_batch(
        model, 2, settings, lambda run, impl, phase, done: seen.append((run, impl)) if phase == "ssm timing" else None)
    assert seen == [(0, "baseline"), (1, "replay"), (2, "replay"), (3, "baseline")]
    assert compare.mirrored(("a", "b", "c")) == ("a", "b", "c", "c", "b", "a")
    assert steps_run == {"baseline": 12, "replay": 12}
    assert [r["impl"] for r in records] == ["baseline", "replay"] and checks[0]["tokens_equal"]


def test_settings_validation() -> None:
    with pytest.raises(ValueError, match="3 flush cycles"):
        CompareSettings(steps=10, buffer_len=16)
    CompareSettings(steps=10, buffer_len=16, state_dtype="bf16")  # the token assert is for fp32 only
    with pytest.raises(ValueError, match="batch"):
        CompareSettings(batches=(0,))
    with pytest.raises(ValueError, match="state_dtype"):
        CompareSettings(state_dtype="fp8")


def test_cli_table_and_slice(tmp_path, tiny_config) -> None:
    from trtllm_replayssm.cli import main
    from trtllm_replayssm.cli.compare_cmd import compare_cmd

    out = tmp_path / "cli"
    args = [str(tiny_config), "--batch", "2", "--steps", "3", "-L", "1", "--gpu-layers", "2", "--prompt-len", "2",
            "--device", "cpu", "-o", str(out)]
    result = CliRunner(env={"COLUMNS": "250"}).invoke(compare_cmd, args)
    assert result.exit_code == 0, result.output
    assert "speed-up" in result.output and "reference decoder" in result.output
    assert "slice of 2 layers" in result.output
    recs = json.loads((out / "compare.json").read_text())["records"]
    assert {r["layers"] for r in recs} == {"0-1 of 4"}
    assert "PyTorch fallback" in result.output  # CPU timings say what they time
    bad = CliRunner().invoke(main, ["compare", str(tiny_config), "--batch", "x", "-o", str(out)])
    assert bad.exit_code == 2 and bad.output.startswith("error: --batch: ") and "comma-separated" in bad.output
    bad = CliRunner().invoke(main, ["compare", "no-such-model", "-o", str(out)])
    assert bad.exit_code == 2 and bad.output.startswith("error: MODEL: unknown preset")
    assert len(bad.output.strip().splitlines()) == 1


def test_trtllm_bench_command_lines(tmp_path) -> None:
    bundle = tmp_path / "bundle"
    with pytest.raises(ValueError, match="trtllm-serve.yaml"):
        trtllm_bench_commands("org/model", bundle, (1, 8), tmp_path)
    (bundle / "trtllm_module").mkdir(parents=True)
    (bundle / "trtllm-serve.yaml").write_text("max_batch_size: 8\n")
    cmds = trtllm_bench_commands("org/model", bundle, (1, 8), tmp_path, num_requests=16)
    assert cmds[0][0] == "dataset" and "prepare-dataset" in cmds[0][2]
    runs = [c for c in cmds if c[0] != "dataset"]
    assert {(impl, b) for impl, b, _ in runs} == {("baseline", 1), ("baseline", 8), ("replay", 1), ("replay", 8)}
    for impl, _, argv in runs:
        data = argv[argv.index("--dataset") + 1]
        assert data == cmds[0][2][cmds[0][2].index("--output") + 1]  # one dataset for every run
        assert ("--custom_module_dirs" in argv) == (impl == "replay")
        assert argv[argv.index("--extra_llm_api_options") + 1] == str(bundle / "trtllm-serve.yaml")


def test_token_check_separates_near_ties_from_mismatches() -> None:
    import torch

    from trtllm_replayssm.lab.compare import check_tokens, token_check
    from trtllm_replayssm.lab.models import DecodeRun

    settings = CompareSettings(batches=(3,), steps=6, buffer_len=2, device="cpu", act_dtype="fp32")
    tokens = torch.arange(21).view(7, 3)
    top = torch.full((6, 3), 4.0)
    gaps = torch.full((6, 3), 1.0)
    gaps[2, 1] = 1e-6  # row 1 diverges at a near-tie (step 3's token comes from decode step 2)
    logits = torch.zeros(6, 3, 5)
    base = DecodeRun(tokens, top, gaps, logits, [1.0], False)
    rep_tokens = tokens.clone()
    rep_tokens[3:, 1] += 100
    rep_logits = logits.clone()
    rep_logits[:, 0] += 1e-5
    rep_logits[3:, 1] += 7.0  # after row 1 diverged: not counted
    check = token_check(base, DecodeRun(rep_tokens, top, gaps, rep_logits, [1.0], False), settings)
    assert not check["tokens_equal"] and check["near_tie_rows"] == 1 and check["mismatch_rows"] == 0
    assert check["near_ties"][0]["step"] == 3 and abs(check["max_abs_dlogits"] - 1e-5) < 1e-7
    check_tokens({"checks": [dict(check, model="m", batch=3)]})  # near-ties do not fail
    rep_tokens[5, 2] += 1  # row 2 diverges where the gap is large: a real mismatch
    check = token_check(base, DecodeRun(rep_tokens, top, gaps, rep_logits, [1.0], False), settings)
    assert check["mismatch_rows"] == 1 and check["mismatches"][0] == {
        "row": 2, "step": 5, "baseline": 17, "replay": 18, "baseline_top2_gap": 1.0, "tolerance": 1e-4}
    from trtllm_replayssm.lab.compare import TokenMismatchError

    with pytest.raises(TokenMismatchError, match="batch 3"):
        check_tokens({"checks": [dict(check, model="m", batch=3)]})


def test_tie_tolerance_is_two_ulps_of_the_top_logit() -> None:
    import torch

    from trtllm_replayssm.lab.compare import tie_tolerance

    assert tie_tolerance(torch.bfloat16, 8.0) == pytest.approx(2 * 2 ** -7 * 8.0)
    assert tie_tolerance(torch.float32, 8.0) == 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("preset,layers", [("nemotron-3-nano-4b", 13), ("qwen3.5-4b", 4)])  # each has attention
def test_compare_on_cuda_preset_slice(tmp_path, preset: str, layers: int) -> None:
    """Real kernels at production head shapes, bf16 activations, fp32 state, CUDA graphs, >= 3 flush cycles."""
    settings = CompareSettings(batches=(1, 64), steps=48, buffer_len=16, gpu_layers=layers, device="cuda")
    report = run_compare([preset], settings, tmp_path)  # raises TokenMismatchError on a non-near-tie divergence
    assert all(r["cuda_graph"] and r["act_dtype"] == "bfloat16" for r in report["records"])
    assert all(r["layers"].startswith(f"0-{layers - 1} of ") for r in report["records"])
    assert all(c["flush_cycles"] >= 3 and c["mismatch_rows"] == 0 for c in report["checks"])
    assert all(0 < r["ssm_share"] < 1 for r in report["records"])


def test_bench_metrics_flattens_latency_and_throughput_leaves() -> None:
    from trtllm_replayssm.lab.compare import bench_metrics

    report = {"performance": {"avg_tpot_ms": 7.5, "output_throughput_tok_s": 1200, "num_requests": 16},
              "engine": {"version": "x"}, "latency": {"p50_latency_ms": 3}, "streaming": True}
    assert bench_metrics(report) == {"performance.avg_tpot_ms": 7.5, "performance.output_throughput_tok_s": 1200.0,
                                     "latency.p50_latency_ms": 3.0}


def _cli(*args: str, preamble: str = "") -> list[str]:
    """argv of the CLI in a fresh interpreter (``preamble`` runs first)."""
    return [sys.executable, "-c", f"{preamble}\nfrom trtllm_replayssm.cli import main\nmain()", *args]


def test_compare_shows_progress_when_piped(tmp_path, tiny_config) -> None:
    r = subprocess.run(_cli("compare", str(tiny_config), "--batch", "1,2", "--steps", "3", "-L", "1",
                            "--prompt-len", "2", "-o", str(tmp_path)), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    for line in (": loading", "tiny-nemotron batch 1 (1/2) baseline: decoding 3 steps",
                 "tiny-nemotron batch 2 (2/2) replay: decoding 3 steps", "tiny-nemotron batch 2 (2/2): done"):
        assert line in r.stderr
    assert "PyTorch fallback" in r.stderr and "speed-up" in r.stdout
    assert json.loads((tmp_path / "compare.json").read_text())["complete"] is True


def test_compare_stopped_early_keeps_what_it_measured(tmp_path, tiny_config) -> None:
    out = tmp_path / "out"
    proc = subprocess.Popen(_cli("compare", str(tiny_config), "--batch", "1,2,3,4,5,6,7,8", "--steps", "400",
                                 "-L", "1", "--prompt-len", "2", "-o", str(out)),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (out / "compare.json").is_file() and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    report = json.loads((out / "compare.json").read_text())
    assert proc.returncode == 130, stderr
    assert report["complete"] is False and {r["batch"] for r in report["records"]} >= {1}
    assert len(report["records"]) < 16 and "stopped early" in stdout
    assert f"interrupted; what was measured is in {out / 'compare.json'}" in stderr


def test_compare_without_matplotlib_prints_the_table_and_writes_json(tmp_path, tiny_config) -> None:
    r = subprocess.run(_cli("compare", str(tiny_config), "--batch", "1", "--steps", "3", "-L", "1",
                            "--prompt-len", "2", "-o", str(tmp_path),
                            preamble="import sys; sys.modules['matplotlib'] = None  # as if not installed"),
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "speed-up" in r.stdout and "Traceback" not in r.stderr
    assert "matplotlib is not installed (pip install 'trtllm-replayssm[plot]')" in r.stderr
    assert (tmp_path / "compare.json").is_file() and not (tmp_path / "compare_speedup.png").exists()
