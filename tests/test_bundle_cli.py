"""`build` / `serve` / `inspect`: bundle layout, YAML keys, manifest, output-directory safety, bad-input exit codes.

Kernels compile for real (NVRTC on the CPU; the kernel cache makes repeats fast).
"""
import json
import os
import stat
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtllm_replayssm.serving import bundle, memory_plan
from trtllm_replayssm.cli import main
from trtllm_replayssm.serving.presets import get_preset

FIX = Path(__file__).parent / "fixtures" / "hf_configs"
MODEL = "tiny-nemotron"  # production head geometry, few heads: the kernels of nemotron-3-super-120b


def run(*args, **kwargs):
    return CliRunner(**kwargs).invoke(main, list(args))


def one_error_line(r, option: str) -> str:
    """The output of a bad-input run: exit 2, one line ``error: <option>: ...``."""
    lines = r.output.strip().splitlines()
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith(f"error: {option}: "), r.output
    return lines[0]


def make_bundle(path: Path, *extra: str) -> dict:
    r = run("build", MODEL, "--gpu", "h100", "-o", str(path), *extra)
    assert r.exit_code == 0, r.output
    return json.loads((path / "manifest.json").read_text())


def test_build_default_nano4b(tmp_path):
    out = tmp_path / "build" / "nano4b"
    r = run("build", "nemotron-3-nano-4b", "--gpu", "h100", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "kernels", "manifest.json", "trtllm-serve.yaml",
                                                     "trtllm_module"]
    m = json.loads((out / "manifest.json").read_text())
    assert m["kernels"] and all(k["file"].startswith("kernels/") and (out / k["file"]).stat().st_size > 1000
                                for k in m["kernels"])
    assert len(list((out / "kernels").glob("*.cubin"))) == len(m["kernels"])
    y = yaml.safe_load((out / "trtllm-serve.yaml").read_text())
    assert y["kv_cache_config"]["enable_block_reuse"] is False
    assert y["kv_cache_config"]["mamba_ssm_cache_dtype"] == "float32"
    assert 0 < y["kv_cache_config"]["free_gpu_memory_fraction"] < 0.9
    assert y["max_batch_size"] == 256 and y["cuda_graph_config"]["batch_sizes"][-1] == 256
    assert m["target"] == {"gpu": "h100", "arch": "sm_90a", "tp_size": 1, "gpu_memory_bytes": 80 * 2**30}
    assert m["buffer_len"] == 16 and m["dtypes"] == {"state": "fp32", "activation": "bf16"}
    assert m["plan"]["family"] == "mamba2" and len(m["plan"]["ssm_layers"]) == 21
    assert m["plan"]["local_heads"] == {"nheads": 96, "n_groups": 8}
    assert m["memory"]["max_concurrent_seqs_replay"] < m["memory"]["max_concurrent_seqs_upstream"]
    assert m["prediction"]["ssm_layer_speedup"] == pytest.approx(1.81, abs=0.01)
    init = (out / "trtllm_module" / "__init__.py").read_text()
    assert "import trtllm_replayssm.serving.trtllm" in init and "manifest.json" in init
    readme = (out / "README.md").read_text()
    assert "--custom_module_dirs" in readme and "trtllm-replayssm serve" in readme
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


def test_bundle_readme_says_how_to_benchmark(tmp_path):
    make_bundle(tmp_path / "b")
    readme = (tmp_path / "b" / "README.md").read_text()
    assert "prepare-dataset --output data.jsonl token-norm-dist" in readme  # how to make the dataset
    assert "--extra_llm_api_options" in readme and "--config" not in readme
    assert "install trtllm-replayssm" in readme and "environment that runs TensorRT-LLM" in readme


def test_bundle_is_readable_by_others(tmp_path):
    make_bundle(tmp_path / "b")
    mask = os.umask(0)
    os.umask(mask)
    assert stat.S_IMODE((tmp_path / "b").stat().st_mode) == 0o777 & ~mask


def test_build_from_model_dir_with_tp(tmp_path):
    out = tmp_path / "b"
    r = run("build", str(FIX / "qwen35_122b"), "--gpu", "b300", "--tp_size", "4", "--buffer-len", "8",
            "--state-dtype", "bf16", "-o", str(out))
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["target"]["arch"] == "sm_103a" and m["plan"]["local_heads"] == {"num_k_heads": 4, "num_v_heads": 16}
    assert m["model"]["path"] == str((FIX / "qwen35_122b").resolve())
    r = run("serve", str(out), "--dry-run", "--", "--port", "9000")
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"trtllm-serve {(FIX / 'qwen35_122b').resolve()} --extra_llm_api_options ")
    assert "--custom_module_dirs" in r.output and r.output.strip().endswith("--port 9000")


@pytest.mark.parametrize("args,option,message", [
    (["--gpu", "a100"], "--gpu", "unknown GPU 'a100'"),
    (["--gpu", "h100", "--tp-size", "3"], "--tp-size", "3 does not divide"),
    (["--gpu", "h100", "--tp_size", "3"], "--tp-size", "3 does not divide"),
    (["--gpu", "h100", "--buffer-len", "0"], "--buffer-len", "1<=x<=32"),
    (["--gpu", "h100", "--buffer-len", "33"], "--buffer-len", "1<=x<=32"),
    (["--gpu", "h100", "--state-dtype", "fp64"], "--state-format", "'fp64' is not one of"),
    (["--gpu", "h100", "--state-mode", "dual"], "--state-format", "dual mode keeps a quantized read copy"),
    (["--gpu", "h100", "--master-format", "fp16"], "--master-format", "only dual mode has a master"),
    (["--gpu", "h100", "--state-format", "fp8", "--state-mode", "dual", "--master-format", "fp8"], "--master-format",
     "expected one of fp32, fp16, bf16 for a fp8 read copy"),
    (["--gpu", "h100", "--stochastic-rounding"], "--stochastic-rounding", "an fp32 checkpoint has no rounded writes"),
    (["--gpu", "h100", "--state-format", "nvfp4", "--tp-size", "3"], "--tp-size", "3 does not divide"),
    (["--gpu", "h100", "--max_batch_size", "0"], "--max-batch-size", "positive integer"),
    (["--gpu", "h100", "--max-batch-size", "100000", "--gpu-memory-gib", "1"], "--max-batch-size", "of 1.0 GiB"),
    (["--gpu", "h100", "--gpu-memory-gib", "-1"], "--gpu-memory-gib", "positive number"),
])
def test_build_bad_input_exit_2(tmp_path, args, option, message):
    out = tmp_path / "o"
    line = one_error_line(run("build", "nemotron-3-nano-4b", *args, "-o", str(out)), option)
    assert message in line and " GB" not in line
    assert list(tmp_path.iterdir()) == []


def test_build_unknown_model_and_missing_option(tmp_path):
    assert "neither a preset" in one_error_line(run("build", "no-such-model", "--gpu", "h100", "-o",
                                                    str(tmp_path / "o")), "MODEL")
    assert "missing" in one_error_line(run("build", MODEL, "-o", str(tmp_path / "o")), "--gpu")
    (tmp_path / "m").mkdir()
    assert "has no config.json" in one_error_line(run("build", str(tmp_path / "m"), "--gpu", "h100", "-o",
                                                      str(tmp_path / "o")), "MODEL")
    assert not (tmp_path / "o").exists()


def test_gpu_and_arch_names_accepted_everywhere(tmp_path):
    m = make_bundle(tmp_path / "b", "--gpu", "sm_90a")  # the last --gpu wins
    assert m["target"]["arch"] == "sm_90a" and m["target"]["gpu"] == "h100"  # the arch's smallest GPU is planned
    r = run("inspect", MODEL, "--gpu", "sm_100a", "--json")
    assert r.exit_code == 0
    target = json.loads(r.output)["target"]
    assert (target["gpu"], target["arch"]) == ("b200", "sm_100a")
    one_error_line(run("compile", "--gpu", "sm_80"), "--gpu")
    one_error_line(run("inspect", MODEL, "--gpu", "x1"), "--gpu")


def test_existing_output_needs_force(tmp_path):
    (tmp_path / "o").mkdir()
    assert "--force" in one_error_line(run("build", MODEL, "--gpu", "h100", "-o", str(tmp_path / "o")), "--output")


def test_force_replaces_a_bundle_atomically(tmp_path):
    out = tmp_path / "b"
    first = make_bundle(out)
    (out / "stale.txt").write_text("from the old bundle")
    second = make_bundle(out, "--buffer-len", "8", "--force")
    assert first["buffer_len"] == 16 and second["buffer_len"] == 8
    assert not (out / "stale.txt").exists()
    assert [p.name for p in tmp_path.iterdir()] == ["b"]  # neither the new nor the old copy left beside it


def test_failed_replacement_keeps_the_old_bundle(tmp_path):
    out = tmp_path / "b"
    make_bundle(out)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    spec = get_preset(MODEL)

    def interrupt(done: int, total: int, name: str) -> None:
        if done:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        bundle.write_bundle(spec, memory_plan.plan(spec, "h100", buffer_len=4), "sm_90a", out, force=True,
                            progress=interrupt)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert json.loads((out / "manifest.json").read_text())["buffer_len"] == 16
    assert [p.name for p in tmp_path.iterdir()] == ["b"]


def test_force_never_replaces_a_directory_that_is_not_a_bundle(tmp_path):
    user = tmp_path / "mine"
    user.mkdir()
    (user / "userfile.txt").write_text("keep me")
    line = one_error_line(run("build", MODEL, "--gpu", "h100", "-o", str(user), "--force"), "--output")
    assert "not a trtllm-replayssm bundle" in line
    assert (user / "userfile.txt").read_text() == "keep me"


@pytest.mark.parametrize("target,reason", [(".", "the working directory"), ("..", "contains the working directory"),
                                           ("/", "the filesystem root")])
def test_force_refuses_working_directory_parents_and_root(tmp_path, target, reason):
    work = tmp_path / "work"
    work.mkdir()
    (work / "userfile.txt").write_text("keep me")
    make_bundle(work / "inner")  # even a directory holding a bundle below is refused
    cwd = os.getcwd()
    os.chdir(work)
    try:
        line = one_error_line(run("build", MODEL, "--gpu", "h100", "-o", target, "--force"), "--output")
    finally:
        os.chdir(cwd)
    assert reason in line
    assert (work / "userfile.txt").read_text() == "keep me" and (work / "inner" / "manifest.json").is_file()


def test_force_refuses_the_working_directory_even_if_it_is_a_bundle(tmp_path):
    make_bundle(tmp_path / "b")
    cwd = os.getcwd()
    os.chdir(tmp_path / "b")
    try:
        line = one_error_line(run("build", MODEL, "--gpu", "h100", "-o", ".", "--force"), "--output")
    finally:
        os.chdir(cwd)
    assert "the working directory" in line and (tmp_path / "b" / "manifest.json").is_file()


def test_force_refuses_a_home_directory(tmp_path):
    home = tmp_path / "home" / "someone"
    home.mkdir(parents=True)
    (home / "notes.txt").write_text("keep me")
    line = one_error_line(run("build", MODEL, "--gpu", "h100", "-o", str(home), "--force",
                              env={"HOME": str(home)}), "--output")
    assert "a home directory" in line and (home / "notes.txt").is_file()


def test_output_that_is_a_file(tmp_path):
    f = tmp_path / "file.txt"
    f.write_text("keep me")
    for extra in ([], ["--force"]):
        assert "is a file" in one_error_line(run("build", MODEL, "--gpu", "h100", "-o", str(f), *extra), "--output")
    assert f.read_text() == "keep me"


def test_serve_errors(tmp_path):
    assert "not a bundle" in one_error_line(run("serve", str(tmp_path)), "BUNDLE_DIR")


def test_inspect_preset_and_json():
    r = run("inspect", "qwen3.5-122b", "--gpu", "h200")
    assert r.exit_code == 0 and "predicted SSM-layer speed-up" in r.output and "1.80x" in r.output
    r = run("inspect", str(FIX / "kimi_linear_48b"), "--json")
    m = json.loads(r.output)
    assert m["plan"]["family"] == "kda" and m["plan"]["served_by_trtllm_module"] is True


def test_inspect_says_what_max_sequences_exclude_and_keys_the_layer_pattern():
    r = run("inspect", "nemotron-3-super-120b", "--gpu", "h200", env={"COLUMNS": "250"})
    assert r.exit_code == 0
    assert "excludes weights, KV cache, activations" in r.output
    layers = next(line for line in r.output.splitlines() if line.startswith("layers: "))
    assert layers.startswith("layers: MEMEMEM*E") and "M Mamba-2" in layers and "* attention" in layers


def test_inspect_bundle_warns_about_plan_options(tmp_path):
    make_bundle(tmp_path / "b")
    r = run("inspect", str(tmp_path / "b"), "--gpu", "b200", "--tp-size", "2")
    assert r.exit_code == 0 and "warning: --gpu, --tp-size ignored" in r.output and "built for h100" in r.output
    r = run("inspect", str(tmp_path / "b"))
    assert r.exit_code == 0 and "warning" not in r.output


def test_help_shows_defaults_limits_and_aliases():
    r = run("build", "--help")
    assert r.exit_code == 0
    assert "--tp-size, --tp_size" in r.output and "--max-batch-size, --max_batch_size" in r.output
    assert "[default: 16; 1<=x<=32]" in r.output and "[default: 256]" in r.output
    for cmd in ("compile", "inspect", "serve", "compare"):
        assert run(cmd, "--help").exit_code == 0
    assert "[default: h100]" in run("inspect", "--help").output
    for cmd in ("build", "inspect"):
        text = run(cmd, "--help").output
        assert "--state-format, --state-dtype" in text and "--stochastic-rounding / --no-stochastic-rounding" in text
    compile_help = " ".join(run("compile", "--help").output.split())
    assert "TRTLLM_REPLAYSSM_CACHE" in compile_help and "layer kernels are not included" in compile_help


def test_usage_errors_are_one_line():
    one_error_line(run("build", MODEL, "--gpu", "h100", "-o", "x", "--tp-size", "two"), "--tp-size")
    r = run("build", MODEL, "--no-such-option")
    assert r.exit_code == 2 and len(r.output.strip().splitlines()) == 1 and r.output.startswith("error: ")
    one_error_line(run("bench", "kernels", "--family", "mamba3"), "--family")
    assert "unknown state format 'fp9'" in one_error_line(run("bench", "kernels", "--state-dtype", "fp9"),
                                                         "--state-dtype")
    one_error_line(run("bench", "kernels", "--batch", "x"), "--batch")


def test_compile_prints_the_kernel_cache(tmp_path):
    r = run("compile", "--gpu", "h100", "--preset", MODEL, env={"TRTLLM_REPLAYSSM_CACHE": str(tmp_path / "kc")})
    assert r.exit_code == 0, r.output
    assert f"kernel cache: {tmp_path / 'kc' / 'sm_90a'}" in r.output
    assert "compiled" in r.output and len(list((tmp_path / "kc" / "sm_90a").glob("*.cubin"))) > 0
    assert "unknown preset" in one_error_line(run("compile", "--gpu", "h100", "--preset", "nope"), "--preset")


# ---------------------------------------------------------------------------------------------------- state specs
def test_state_option_names_match_core_formats():
    from trtllm_replayssm.cli import options
    from trtllm_replayssm.core import formats

    assert options.STATE_FORMATS == tuple(formats.STATE_FORMATS)
    assert (options.STATE_MODES, options.MASTER_FORMATS) == (formats.STATE_MODES, formats.MASTER_FORMATS)
    assert options.QUANT_FORMATS == formats.QUANT_FORMATS


@pytest.mark.parametrize("model,args,label,why", [
    ("kimi-linear-48b", ["--state-dtype", "fp8", "--spec-tokens", "3"], "fp8", "speculative verify"),
    ("qwen3.5-4b", ["--state-format", "nvfp4", "--state-mode", "dual", "--master-format", "fp16", "--spec-tokens", "1"],
     "nvfp4/dual/fp16", "speculative verify (--spec-tokens) reads plain"),
])
def test_build_refuses_states_it_cannot_serve(tmp_path, model, args, label, why):
    r = run("build", model, "--gpu", "h100", "-o", str(tmp_path / "o"), *args)
    lines = r.output.strip().splitlines()
    assert r.exit_code == 1 and len(lines) == 1, r.output
    assert lines[0].startswith(f"error: {label} state: ") and why in lines[0]
    assert list(tmp_path.iterdir()) == []  # nothing written, not even beside the target


def test_write_bundle_refuses_before_writing(tmp_path):
    from trtllm_replayssm.core.formats import state_spec
    spec = get_preset(MODEL)
    mp = memory_plan.plan(spec, "h100", state=state_spec("nvfp4"), spec_tokens=2)
    with pytest.raises(NotImplementedError, match=r"speculative verify \(--spec-tokens\) reads plain"):
        bundle.write_bundle(spec, mp, "sm_90a", tmp_path / "o")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("model", [MODEL, "qwen3.5-4b", "kimi-linear-48b"])
def test_build_dual_bundle(tmp_path, model):
    """The pool holds the fp16 master, the NVFP4 read copy is ours: stored kernels, the master's pool dtype."""
    out = tmp_path / "b"
    r = run("build", model, "--gpu", "h100", "-o", str(out), "--state-format", "nvfp4", "--state-mode", "dual",
            "--master-format", "fp16")
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["state"]["label"] == "nvfp4/dual/fp16" and m["state"]["trtllm_pool_holds"] == "master"
    state_modules = [k["name"] for k in m["kernels"] if k["kernels"] != ["conv1d_update_kernel"]]
    assert state_modules and all("master_fmt0_read_fmt2" in name for name in state_modules)
    # every bundle carries the conv1d decode step the module runs before its decode ops
    assert len(m["kernels"]) == len(state_modules) + 1
    assert "  mamba_ssm_cache_dtype: float16\n" in (out / bundle.SERVE_YAML).read_text()
    from trtllm_replayssm.serving.trtllm import load_settings
    assert load_settings(out / "manifest.json").state == "nvfp4/dual/fp16"


def test_build_codes_bundle(tmp_path):
    """A shared NVFP4 checkpoint: its codes in a bf16 pool, its scales ours; the YAML says so."""
    out = tmp_path / "b"
    r = run("build", "qwen3.5-4b", "--gpu", "h100", "-o", str(out), "--state-format", "nvfp4")
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert (m["state"]["label"], m["state"]["trtllm_pool_holds"], m["state"]["trtllm_pool_dtype"]) == (
        "nvfp4", "codes", "bf16")
    assert m["memory"]["per_layer_per_seq"]["our_state"] == 32 * 128 * (128 // 16 + 4)
    yaml = (out / bundle.SERVE_YAML).read_text()
    assert "Holds our nvfp4 codes (bf16: the smallest pool)" in yaml and "  mamba_ssm_cache_dtype: bfloat16\n" in yaml


def test_build_records_the_state_spec(tmp_path):
    m = make_bundle(tmp_path / "b", "--state-dtype", "bf16")
    assert m["dtypes"]["state"] == "bf16"
    assert m["state"] == {"state_format": "bf16", "state_mode": "plain", "master_format": None,
                          "stochastic_rounding": False, "label": "bf16", "summary": "plain bf16 checkpoint",
                          "trtllm_pool_dtype": "bf16", "trtllm_pool_holds": "checkpoint", "trtllm_note": None}
    per = m["memory"]["per_layer_per_seq"]
    assert per["upstream_state"] == per["checkpoint"] == 4 * 64 * 128 * 2 and per["our_state"] == 0
    assert m["memory"]["reserve_bytes_per_gpu"] == m["memory"]["ring_bytes_per_gpu"]


def test_inspect_plans_and_prints_every_state():
    r = run("inspect", "nemotron-3-nano-4b", "--gpu", "h200", "--state-format", "nvfp4", "--state-mode", "dual",
            "--master-format", "fp16", env={"COLUMNS": "250"})
    assert r.exit_code == 0, r.output
    assert "16 / nvfp4/dual/fp16 / bf16" in r.output
    assert "dual: nvfp4 read copy for non-flush steps, fp16 master for flushes" in r.output
    assert "fp16, holds our master" in r.output and "TensorRT-LLM note" not in r.output
    assert "1.88 MiB / 0.56 MiB" in r.output  # 96 x 80 rows: fp16 master 256 B, nvfp4 read copy 76 B per row
    r = run("inspect", "qwen3.5-4b", "--state-format", "fp8", "--json")
    m = json.loads(r.output)
    assert (m["state"]["state_format"], m["state"]["state_mode"], m["state"]["master_format"]) == ("fp8", "shared",
                                                                                                  None)
    assert m["state"]["trtllm_pool_holds"] == "codes" and "first 50% of each slot" in m["state"]["trtllm_note"]
    per = m["memory"]["per_layer_per_seq"]
    assert (per["upstream_state"], per["our_state"]) == (32 * 128 * 256, 32 * 128 * 4)  # bf16 pool, FP8 row scales
    r = run("inspect", "qwen3.5-4b", "--state-format", "fp8", env={"COLUMNS": "250"})
    assert r.exit_code == 0 and "TensorRT-LLM note" in r.output and "bf16, holds our fp8 codes" in r.output


def test_inspect_bundle_warns_about_state_options(tmp_path):
    make_bundle(tmp_path / "b")
    r = run("inspect", str(tmp_path / "b"), "--state-format", "fp8", "--no-stochastic-rounding")
    assert r.exit_code == 0 and "warning: --state-format, --stochastic-rounding ignored" in r.output
