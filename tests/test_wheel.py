"""The built wheel: it carries every non-Python file the package reads at run time, and a fresh virtual environment
outside the repository serves `compile`, `build` and `inspect` from it."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
import venv
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Every non-Python file the package opens at run time, as it lies in the wheel.
RUNTIME_FILES = ["trtllm_replayssm/serving/trtllm/trtllm_symbols.json"] + [
    f"trtllm_replayssm/_plugins/{p.name}" for p in sorted((REPO / "plugins").glob("*.cu*"))]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the sources (the checkout's build/ stays untouched)."""
    src = tmp_path_factory.mktemp("src")
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(REPO / name, src / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "trtllm_replayssm", src / "trtllm_replayssm", ignore=ignore)
    shutil.copytree(REPO / "plugins", src / "plugins")
    dist = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(dist),
                    str(src)], check=True, timeout=300)
    (whl,) = dist.glob("trtllm_replayssm-*.whl")
    return whl


def test_wheel_holds_every_runtime_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    assert len(RUNTIME_FILES) > 4 and [f for f in RUNTIME_FILES if f not in names] == []


def test_wheel_serves_the_cli_from_a_fresh_venv(wheel: Path, tmp_path: Path) -> None:
    env_dir, work = tmp_path / "venv", tmp_path / "work"
    venv.create(env_dir, system_site_packages=True, with_pip=False)  # dependencies (torch, cuda-python) shared
    py = env_dir / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, timeout=300)
    work.mkdir()
    env = {"PATH": f"{env_dir / 'bin'}:/usr/bin:/bin", "HOME": str(tmp_path),
           "TRTLLM_REPLAYSSM_CACHE": str(tmp_path / "kernel-cache")}

    def run(*argv: str) -> str:
        r = subprocess.run(list(argv), cwd=work, env=env, capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stdout + r.stderr
        return r.stdout + r.stderr

    where = json.loads(run(str(py), "-c", "import json, trtllm_replayssm as t; "
                                          "from trtllm_replayssm.core.jit.compiler import plugin_dir; "
                                          "from trtllm_replayssm.serving.trtllm.core import SYMBOLS_PATH; "
                                          "print(json.dumps([t.__file__, str(plugin_dir()), str(SYMBOLS_PATH)]))"))
    assert all(p.startswith(str(env_dir)) for p in where), where  # the wheel, not the checkout
    assert Path(where[2]).is_file()
    cli = str(env_dir / "bin" / "trtllm-replayssm")
    assert "compiled" in run(cli, "compile", "--gpu", "h100", "--preset", "tiny-qwen")
    run(cli, "build", "tiny-qwen", "--gpu", "h100", "-o", "bundle")
    assert json.loads((work / "bundle" / "manifest.json").read_text())["plan"]["family"] == "gdn"
    assert "predicted SSM-layer speed-up" in run(cli, "inspect", "bundle")
