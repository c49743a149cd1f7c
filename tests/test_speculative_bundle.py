"""`build --spec-tokens N`: the YAML's MTP speculative_config, rings priced for windows of N + 1 tokens, the
manifest and `inspect` saying who serves it, bad values, and the refusal where upstream's Mamba-2 MTP replay (what
serves a configuration the module refuses) corrupts state (head_dim 80). Nothing here runs TensorRT-LLM."""
import json
import random

import pytest
import yaml
from click.testing import CliRunner

from trtllm_replayssm.cli import main
from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.serving import bundle, memory_plan, speculative
from trtllm_replayssm.serving.presets import get_preset

NANO = "nemotron-3-nano-4b"  # Mamba-2 head_dim 80: upstream's MTP replay is unsafe
TINY = "tiny-nemotron"  # Mamba-2 head_dim 64


def run(*args: str):
    return CliRunner().invoke(main, list(args), env={"COLUMNS": "1000"})  # wide enough that table cells do not wrap


def one_error_line(r, option: str) -> str:
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {option}: "), r.output
    return lines[0]


def test_yaml_has_mtp_speculative_config_only_with_spec_tokens():
    spec = get_preset("qwen3.5-4b")
    with_spec = yaml.safe_load(bundle.serve_yaml(spec, memory_plan.plan(spec, "h100", spec_tokens=3)))
    assert with_spec["speculative_config"] == {"decoding_type": "MTP", "max_draft_len": 3,
                                               "num_nextn_predict_layers": 3}
    plain = yaml.safe_load(bundle.serve_yaml(spec, memory_plan.plan(spec, "h100")))
    assert "speculative_config" not in plain
    kv, plain_kv = with_spec["kv_cache_config"].pop("free_gpu_memory_fraction"), plain["kv_cache_config"].pop(
        "free_gpu_memory_fraction")
    assert kv < plain_kv  # longer rings keep more memory free
    assert {k: v for k, v in with_spec.items() if k != "speculative_config"} == plain


def test_ring_len_follows_the_fold_rule():
    # rings of L + T = L + N + 1 positions: a verify folds when count + 2T > R, so L - T + 1 .. L records at a time
    assert [speculative.ring_len(16, n) for n in (None, 1, 3, 7)] == [16, 18, 20, 24]
    assert speculative.ring_len(1, 1) == 3


@pytest.mark.parametrize("L,n", [(16, 1), (16, 3), (16, 7), (8, 3), (4, 1)])
def test_rings_of_l_plus_t_fold_l_minus_t_plus_1_to_l_records(L, n):
    """With rings of L + T positions every window fits after the history, and each fold (the verify's, before a
    window: spec_cursor.folds_before) takes L - T + 1 .. L committed records, over random accepted counts."""
    T, R = n + 1, speculative.ring_len(L, n)
    gen, count, folded = random.Random(L * 10 + n), 0, []
    for _ in range(5000):
        if spec_cursor.folds_before(count, T, R):
            folded.append(count)
            count = 0
        assert count + T <= R
        count += gen.randint(1, T)
    assert min(folded) == L - T + 1 and max(folded) == L


@pytest.mark.parametrize("bad", [0, 8, -1, True, 2.0, "3"])
def test_bad_spec_tokens(bad):
    with pytest.raises(ValueError, match=r"^spec_tokens: expected 1 to 7 draft tokens per verify step"):
        speculative.check_spec_tokens(bad)
    with pytest.raises(ValueError, match=r"^spec_tokens: "):
        memory_plan.plan(get_preset(NANO), "h200", spec_tokens=bad)


def test_memory_plan_prices_rings_for_windows_by_hand():
    spec = get_preset(NANO)  # 21 Mamba-2 layers, nheads 96, head_dim 80, n_groups 8, d_state 128
    record = 96 * 80 * 2 + 8 * 128 * 2 + 96 * 4  # x bf16, B bf16, dt fp32 per token
    mem = 141 * 2**30  # H200
    base, spec3 = memory_plan.plan(spec, "h200"), memory_plan.plan(spec, "h200", spec_tokens=3)
    assert base.layer.record == spec3.layer.record == record == 17792
    assert (base.ring_len, base.layer.ring, base.spec_tokens) == (16, 16 * 17792, None)
    assert (spec3.ring_len, spec3.layer.ring, spec3.spec_tokens) == (20, 20 * 17792, 3)
    assert spec3.ring_bytes_per_gpu == spec3.reserve_bytes_per_gpu == 21 * (20 * 17792 + 8) * 257 == 1920511656
    assert base.ring_bytes_per_gpu == 21 * (16 * 17792 + 8) * 257 == 1536417960
    assert spec3.per_seq_replay - base.per_seq_replay == 21 * 4 * 17792
    assert spec3.per_seq_upstream == base.per_seq_upstream
    assert spec3.free_gpu_memory_fraction == round(0.9 - 1920511656 / (0.5 * mem), 3) == 0.875
    assert base.free_gpu_memory_fraction == 0.88
    assert spec3.step == base.step  # the prediction is standard decode's


def test_hazard_only_for_mamba2_head_dims_the_tma_tiles_overrun():
    assert "head_dim 80" in speculative.upstream_mtp_hazard(get_preset(NANO))
    for name in (TINY, "nemotron-3-super-120b", "qwen3.5-4b", "kimi-linear-48b"):
        assert speculative.upstream_mtp_hazard(get_preset(name)) is None
    assert speculative.upstream_mtp_warning(get_preset(NANO), None, False) is None
    with pytest.raises(ValueError, match=r"^spec_tokens: refusing to build: .*--allow-upstream-mtp"):
        speculative.upstream_mtp_warning(get_preset(NANO), 3, False)
    assert "head_dim 80" in speculative.upstream_mtp_warning(get_preset(NANO), 3, True)


@pytest.mark.parametrize("value, message", [("0", "expected 1 to 7"), ("8", "expected 1 to 7"),
                                            ("x", "'x' is not a valid integer")])
def test_build_bad_spec_tokens_exit_2(tmp_path, value, message):
    line = one_error_line(run("build", TINY, "--gpu", "h100", "-o", str(tmp_path / "o"), "--spec-tokens", value),
                          "--spec-tokens")
    assert message in line
    assert list(tmp_path.iterdir()) == []


def test_build_refuses_head_dim_80_without_the_flag(tmp_path):
    line = one_error_line(run("build", NANO, "--gpu", "h200", "-o", str(tmp_path / "o"), "--spec-tokens", "3"),
                          "--spec-tokens")
    assert "head_dim 80" in line and "--allow-upstream-mtp" in line
    assert list(tmp_path.iterdir()) == []


def test_build_head_dim_80_with_the_flag_warns_and_records_it(tmp_path):
    out = tmp_path / "nano"
    r = run("build", NANO, "--gpu", "h200", "-o", str(out), "--spec-tokens", "3", "--allow-upstream-mtp")
    assert r.exit_code == 0, r.output
    assert "WARNING: " in r.output and "corrupted outputs" in r.output
    m = json.loads((out / "manifest.json").read_text())
    assert "head_dim 80" in m["speculative"]["upstream_mtp_hazard"]
    table = run("inspect", str(out))
    assert table.exit_code == 0 and "WARNING upstream MTP" in table.output


def test_spec_bundle_manifest_yaml_and_inspect(tmp_path):
    out = tmp_path / "b"
    r = run("build", TINY, "--gpu", "h100", "-o", str(out), "--spec-tokens", "2")
    assert r.exit_code == 0 and "WARNING" not in r.output, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["spec_tokens"] == 2 and m["memory"]["ring_len"] == 19
    from trtllm_replayssm.serving.trtllm import load_settings
    assert load_settings(out / "manifest.json").spec_tokens == 2  # what the module sizes its rings by
    s = m["speculative"]
    assert (s["spec_tokens"], s["window_tokens"], s["ring_len"], s["served_by"]) == (2, 3, 19, "ReplaySSM MTP verify")
    assert s["upstream_mtp_hazard"] is None and "verifies each MTP window from checkpoint + ring" in s["note"]
    assert s["speculative_config"] == yaml.safe_load((out / "trtllm-serve.yaml").read_text())["speculative_config"]
    per = m["memory"]["per_layer_per_seq"]
    assert per["ring"] == 19 * memory_plan.plan(get_preset(TINY), "h100").layer.record
    table = run("inspect", str(out)).output
    assert "MTP, 2 draft tokens" in table and "ReplaySSM MTP verify" in table and "WARNING" not in table


def test_plain_bundle_records_no_speculation(tmp_path):
    r = run("build", TINY, "--gpu", "h100", "-o", str(tmp_path / "b"))
    assert r.exit_code == 0, r.output
    m = json.loads((tmp_path / "b" / "manifest.json").read_text())
    assert m["spec_tokens"] is None and m["speculative"] is None and m["memory"]["ring_len"] == 16
    assert "speculative decoding" not in run("inspect", str(tmp_path / "b")).output


def test_inspect_preset_plans_spec_tokens_and_checks_them():
    r = run("inspect", NANO, "--gpu", "h200", "--spec-tokens", "3")
    assert r.exit_code == 0 and "WARNING upstream MTP" in r.output and "windows of 4" in r.output
    assert "expected 1 to 7" in one_error_line(run("inspect", NANO, "--spec-tokens", "9"), "--spec-tokens")
