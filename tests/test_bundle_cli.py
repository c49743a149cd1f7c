"""`build` / `serve` / `inspect`: bundle layout, YAML keys, manifest, bad-input exit codes.

The kernel-compile step uses the real ``kernels.configs.configs_for_spec``; only ``kernels.compiler.compile_config``
is replaced by one writing a tiny file, so the test stays fast and runs where NVRTC or the plugin sources are absent.
"""
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from trtllm_replayssm.cli import main
from trtllm_replayssm.kernels import compiler, configs

FIX = Path(__file__).parent / "fixtures" / "hf_configs"
needs_configs = pytest.mark.skipif(not hasattr(configs, "configs_for_spec"),
                                   reason="kernels.configs.configs_for_spec not written yet")


@pytest.fixture
def fake_compile(monkeypatch, tmp_path):
    calls = []

    def compile_config(cfg, arch, *, force=False):
        calls.append((cfg.name, arch))
        path = tmp_path / "cache" / f"{cfg.name}.cubin"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"cubin:" + arch.encode())
        return compiler.CompiledKernel(cfg, arch, path, "")

    monkeypatch.setattr(compiler, "compile_config", compile_config)
    return calls


def run(*args):
    return CliRunner().invoke(main, list(args))


@needs_configs
def test_build_default_nano4b(tmp_path, fake_compile):
    out = tmp_path / "build" / "nano4b"
    r = run("build", "nemotron-3-nano-4b", "--gpu", "h100", "-o", str(out))
    assert r.exit_code == 0, r.output
    assert sorted(p.name for p in out.iterdir()) == ["README.md", "kernels", "manifest.json", "trtllm-serve.yaml",
                                                     "trtllm_module"]
    assert fake_compile and all(arch == "sm_90a" for _, arch in fake_compile)
    assert len(list((out / "kernels").glob("*.cubin"))) == len(set(fake_compile))
    y = yaml.safe_load((out / "trtllm-serve.yaml").read_text())
    assert y["kv_cache_config"]["enable_block_reuse"] is False
    assert y["kv_cache_config"]["mamba_ssm_cache_dtype"] == "float32"
    assert 0 < y["kv_cache_config"]["free_gpu_memory_fraction"] < 0.9
    assert y["max_batch_size"] == 256 and y["cuda_graph_config"]["batch_sizes"][-1] == 256
    m = json.loads((out / "manifest.json").read_text())
    assert m["target"] == {"gpu": "h100", "arch": "sm_90a", "tp_size": 1, "gpu_memory_bytes": 80 * 2**30}
    assert m["buffer_len"] == 16 and m["dtypes"] == {"state": "fp32", "activation": "bf16"}
    assert m["plan"]["family"] == "mamba2" and len(m["plan"]["ssm_layers"]) == 21
    assert m["plan"]["local_heads"] == {"nheads": 96, "n_groups": 8}
    assert m["memory"]["max_concurrent_seqs_replay"] < m["memory"]["max_concurrent_seqs_upstream"]
    assert m["prediction"]["ssm_layer_speedup"] == pytest.approx(1.81, abs=0.01)
    init = (out / "trtllm_module" / "__init__.py").read_text()
    assert "import trtllm_replayssm.trtllm" in init and "manifest.json" in init
    readme = (out / "README.md").read_text()
    assert "--custom_module_dirs" in readme and "trtllm-replayssm serve" in readme
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp dir left


@needs_configs
def test_build_from_model_dir_with_tp(tmp_path, fake_compile):
    out = tmp_path / "b"
    r = run("build", str(FIX / "qwen35_122b"), "--gpu", "b300", "--tp-size", "4", "--buffer-len", "8",
            "--state-dtype", "bf16", "-o", str(out))
    assert r.exit_code == 0, r.output
    m = json.loads((out / "manifest.json").read_text())
    assert m["target"]["arch"] == "sm_103a" and m["plan"]["local_heads"] == {"num_k_heads": 4, "num_v_heads": 16}
    assert m["model"]["path"] == str((FIX / "qwen35_122b").resolve())
    r = run("serve", str(out), "--dry-run", "--", "--port", "9000")
    assert r.exit_code == 0, r.output
    assert r.output.startswith(f"trtllm-serve {(FIX / 'qwen35_122b').resolve()} --config ")
    assert "--custom_module_dirs" in r.output and r.output.strip().endswith("--port 9000")


@pytest.mark.parametrize("args,message", [
    (["nemotron-3-nano-4b", "--gpu", "a100"], "unknown GPU 'a100'"),
    (["nemotron-3-nano-4b", "--gpu", "h100", "--tp-size", "3"], "tp_size: 3 does not divide"),
    (["nemotron-3-nano-4b", "--gpu", "h100", "--buffer-len", "0"], "buffer_len"),
    (["nemotron-3-nano-4b", "--gpu", "h100", "--buffer-len", "1000"], "buffer_len"),
    (["no-such-model", "--gpu", "h100"], "neither a preset"),
])
def test_build_bad_input_exit_2(tmp_path, args, message, fake_compile):
    out = tmp_path / "o"
    r = run("build", *args, "-o", str(out))
    assert r.exit_code == 2 and message in r.output and len(r.output.strip().splitlines()) == 1
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_build_model_dir_without_config(tmp_path, fake_compile):
    (tmp_path / "m").mkdir()
    r = run("build", str(tmp_path / "m"), "--gpu", "h100", "-o", str(tmp_path / "o"))
    assert r.exit_code == 2 and "has no config.json" in r.output
    assert not (tmp_path / "o").exists()


def test_build_existing_output_needs_force(tmp_path, fake_compile):
    (tmp_path / "o").mkdir()
    r = run("build", "nemotron-3-nano-4b", "--gpu", "h100", "-o", str(tmp_path / "o"))
    assert r.exit_code == 2 and "--force" in r.output


@needs_configs
def test_failed_compile_leaves_nothing(tmp_path, monkeypatch):
    def broken(cfg, arch, *, force=False):
        raise compiler.KernelCompileError("boom")

    monkeypatch.setattr(compiler, "compile_config", broken)
    r = run("build", "nemotron-3-nano-4b", "--gpu", "h100", "-o", str(tmp_path / "o"))
    assert r.exit_code != 0 and list(tmp_path.iterdir()) == []


def test_serve_errors(tmp_path):
    r = run("serve", str(tmp_path))
    assert r.exit_code == 2 and "not a bundle" in r.output


def test_inspect_preset_and_json():
    r = run("inspect", "qwen3.5-122b", "--gpu", "h200")
    assert r.exit_code == 0 and "predicted SSM-layer speed-up" in r.output and "1.80x" in r.output
    r = run("inspect", str(FIX / "kimi_linear_48b"), "--json")
    m = json.loads(r.output)
    assert m["plan"]["family"] == "kda" and m["plan"]["served_by_trtllm_module"] is False
    r = run("inspect", "qwen3.5-4b", "--gpu", "x1")
    assert r.exit_code == 2
