"""The small-batch probe (benchmarks/dev/small_batch_probe.py) compiles from the shared header without spills."""
import shutil
import sys
from pathlib import Path

import pytest

from trtllm_replayssm.core.jit.compiler import PLUGIN_DIR_ENV, compile_config

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks" / "dev"))
import small_batch_probe  # noqa: E402


@pytest.mark.parametrize("rows", [16, 64])
def test_probe_compiles_without_spills(rows, tmp_path, monkeypatch):
    monkeypatch.setenv("TRTLLM_REPLAYSSM_CACHE", str(tmp_path))
    monkeypatch.setenv(PLUGIN_DIR_ENV, "")  # use_probe_sources sets it; the original is restored after the test
    src_dir = small_batch_probe.use_probe_sources()
    try:
        log = compile_config(small_batch_probe.probe_config(rows), "sm_90a").log
    finally:
        shutil.rmtree(src_dir)
    assert "spill" not in log.replace("0 bytes spill", "")
    for kernel in small_batch_probe.KERNELS:
        assert f"Compiling entry function '{kernel}'" in log
