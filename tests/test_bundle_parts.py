"""The bundle writer's parts without the CLI: progress, the manifest test, the output-directory guard, the umask
read-back, the README's model argument and the CUDA-graph sizes for large batches."""
from __future__ import annotations

import json
import os

import pytest

from trtllm_replayssm.serving import bundle
from trtllm_replayssm.serving.memory_plan import plan
from trtllm_replayssm.serving.presets import get_preset


def test_compile_progress_counts_every_config(monkeypatch, tmp_path):
    from trtllm_replayssm.core.jit import compiler
    calls = []

    def fake_compile_all(cfgs, arch, progress=None):  # the NVRTC build itself is tested elsewhere
        for cfg in cfgs:
            progress(cfg)
        return [type("R", (), {"cubin_path": tmp_path / "k.cubin"})() for _ in cfgs]

    (tmp_path / "k.cubin").write_bytes(b"\0")
    monkeypatch.setattr(compiler, "compile_all", fake_compile_all)
    spec = get_preset("qwen3.5-4b")
    entries = bundle.compile_kernels(spec, "sm_90a", "fp32", "bf16", 1, tmp_path / "kernels",
                                     progress=lambda i, n, name: calls.append((i, n)))
    n = len(entries)
    assert n > 0 and calls == [(i, n) for i in range(1, n + 1)]


def test_is_bundle(tmp_path):
    assert not bundle.is_bundle(tmp_path)
    (tmp_path / bundle.MANIFEST).write_text(json.dumps(["toolkit_version", "plan", "kernels"]))
    assert not bundle.is_bundle(tmp_path)
    (tmp_path / bundle.MANIFEST).write_text(json.dumps({"toolkit_version": 1, "plan": {}}))
    assert not bundle.is_bundle(tmp_path)
    (tmp_path / bundle.MANIFEST).write_text(json.dumps({"toolkit_version": 1, "plan": {}, "kernels": []}))
    assert bundle.is_bundle(tmp_path)


def test_write_bundle_checks_the_output_first(tmp_path):
    spec = get_preset("qwen3.5-4b")
    target = tmp_path / "taken"
    target.mkdir()
    (target / "notes.txt").write_text("keep")
    with pytest.raises(ValueError, match=r"exists; pass --force"):
        bundle.write_bundle(spec, plan(spec, "h200"), "sm_90a", target)
    with pytest.raises(ValueError, match=r"it is not a trtllm-replayssm bundle"):
        bundle.write_bundle(spec, plan(spec, "h200"), "sm_90a", target, force=True)
    assert (target / "notes.txt").read_text() == "keep" and sorted(p.name for p in tmp_path.iterdir()) == ["taken"]


def test_umask_read_back_leaves_it_unchanged():
    before = os.umask(0o027)
    try:
        assert bundle._umask() == 0o027
        assert os.umask(0o027) == 0o027
    finally:
        os.umask(before)


def test_readme_names_the_model_argument(tmp_path):
    spec = get_preset("qwen3.5-4b")
    mp = plan(spec, "h200")
    assert "<local dir or HF id of qwen3.5-4b>" in bundle.readme(spec, mp, tmp_path, None)
    text = bundle.readme(spec, mp, tmp_path, "/models/qwen")
    assert "/models/qwen" in text and "<local dir or HF id" not in text
    assert "does not replace their mixers" not in text  # GDN is served


def test_yaml_graph_sizes_of_large_batches():
    spec = get_preset("qwen3.5-4b")
    text = bundle.serve_yaml(spec, plan(spec, "h200", max_batch_size=1500))
    assert "  batch_sizes: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 1500]\n" in text
    text = bundle.serve_yaml(spec, plan(spec, "h200", max_batch_size=512))
    assert "  batch_sizes: [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]\n" in text


def test_swap_into_place_restores_the_old_bundle_when_the_rename_fails(tmp_path):
    out = tmp_path / "bundle"
    out.mkdir()
    (out / "manifest.json").write_text("old")
    with pytest.raises(FileNotFoundError):
        bundle._swap_into_place(tmp_path / "missing", out)
    assert (out / "manifest.json").read_text() == "old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]
    new = tmp_path / "new"
    new.mkdir()
    (new / "manifest.json").write_text("new")
    bundle._swap_into_place(new, out)
    assert (out / "manifest.json").read_text() == "new" and sorted(p.name for p in tmp_path.iterdir()) == ["bundle"]


def test_build_into_missing_parents_and_manifest_format(tmp_path):
    from test_bundle_cli import run
    out = tmp_path / "a" / "b" / "bundle"
    r = run("build", "qwen3.5-4b", "--gpu", "h200", "-o", str(out))
    assert r.exit_code == 0, r.output
    text = (out / "manifest.json").read_text()
    assert text.startswith('{\n  "') and text.endswith("}\n")
    m = json.loads(text)
    spec = get_preset("qwen3.5-4b")
    mp = plan(spec, "h200")
    assert m["prediction"]["ssm_layer_speedup"] == round(mp.step.speedup, 4) != round(mp.step.speedup, 5)
    ring_gib = mp.ring_bytes_per_gpu / 2**30
    assert f"the rings ({ring_gib:.2f} GiB for 256+1 slots on each GPU)" in (out / "trtllm-serve.yaml").read_text()


def test_manifest_and_yaml_of_a_dual_state():
    from trtllm_replayssm.core.formats import state_spec
    spec = get_preset("qwen3.5-4b")
    mp = plan(spec, "h200", state=state_spec("nvfp4", "dual", "fp16"), max_batch_size=64)
    m = bundle.manifest_dict(spec, mp, "sm_90a", [], None)
    assert {k: m["state"][k] for k in ("state_format", "state_mode", "master_format", "stochastic_rounding")} == {
        "state_format": "nvfp4", "state_mode": "dual", "master_format": "fp16", "stochastic_rounding": False}
    assert (m["state"]["trtllm_pool_dtype"], m["state"]["trtllm_pool_holds"]) == ("fp16", "master")
    per = m["memory"]["per_layer_per_seq"]
    assert (per["upstream_state"], per["our_state"]) == (32 * 128 * 256, 32 * 128 * 76)
    assert per["checkpoint"] == per["upstream_state"] + per["our_state"]
    assert m["memory"]["reserve_bytes_per_gpu"] == 24 * (per["ring"] + 8 + per["our_state"]) * 65
    assert "M master, R read copy" in m["prediction"]["model"]
    text = bundle.serve_yaml(spec, mp)
    assert "  mamba_ssm_cache_dtype: float16\n" in text and "the nvfp4 read copy is in our cache" in text
    gib = mp.reserve_bytes_per_gpu / 2**30
    assert f"the rings and our state ({gib:.2f} GiB for 64+1 slots on each GPU)" in text


def test_build_refusal():
    from trtllm_replayssm.core.formats import parse_state_label
    for label in ("fp32", "fp16", "bf16", "bf16+sr", "fp8", "nvfp4+sr", "fp8/dual/fp32", "nvfp4/dual/fp8"):
        assert bundle.build_refusal(parse_state_label(label), None) is None
    for label in ("fp32", "bf16"):
        assert bundle.build_refusal(parse_state_label(label), 3) is None
    for label in ("bf16+sr", "nvfp4", "nvfp4/dual/fp16"):
        assert "speculative verify (--spec-tokens) reads plain" in bundle.build_refusal(parse_state_label(label), 3)


def test_dual_spec_configs_are_the_stored_kernels():
    from trtllm_replayssm.core.formats import parse_state_label
    from trtllm_replayssm.serving.catalog import spec_configs
    from trtllm_replayssm.serving.presets import get_preset

    plain = spec_configs(get_preset("nemotron-3-nano-4b"), "fp16", "bf16")
    dual = spec_configs(get_preset("nemotron-3-nano-4b"), parse_state_label("nvfp4/dual/fp16"), "bf16")
    decode = [c for c in plain if c.family == "mamba2"]
    # both ship the conv1d decode step; plain checkpoints also the speculative commit
    assert [c.family for c in plain if c not in decode] == ["spec", "conv"]
    dual_decode = [c for c in dual if c.family == "mamba2"]
    assert [c.family for c in dual if c not in dual_decode] == ["conv"]
    assert len(dual_decode) == len(decode) and all("master_fmt0_read_fmt2" in c.name for c in dual_decode)
    assert not any("read_fmt" in c.name for c in plain)
    assert spec_configs(get_preset("nemotron-3-nano-4b"), parse_state_label("fp16"), "bf16") == plain
