"""The README's first commands run as written on a CPU-only machine, each within a minute (those marked as needing a
CUDA GPU excepted)."""
from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

README = Path(__file__).resolve().parents[1] / "README.md"
GPU_MARK = "# needs a CUDA GPU"


def first_commands() -> list[tuple[list[str], bool]]:
    """``(argv, needs_gpu)`` of each command in the README's "First commands" code block, in order."""
    text = README.read_text().split("## First commands", 1)[1]
    block = text.split("```bash\n", 1)[1].split("```", 1)[0]
    out = []
    for line in block.splitlines():
        if line.startswith("trtllm-replayssm "):
            command, _, comment = line.partition("#")
            out.append((shlex.split(command), GPU_MARK in f"#{comment}"))
    return out


def test_readme_lists_first_commands() -> None:
    commands = first_commands()
    assert len(commands) >= 5 and {argv[1] for argv, _ in commands} >= {"build", "inspect", "compile", "serve",
                                                                      "compare"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only experience")
def test_first_commands_finish_on_a_cpu_within_a_minute(tmp_path: Path) -> None:
    for argv, needs_gpu in first_commands():
        if needs_gpu:
            continue
        r = subprocess.run([sys.executable, "-m", "trtllm_replayssm", *argv[1:]], cwd=tmp_path, capture_output=True,
                           text=True, timeout=60)
        assert r.returncode == 0, f"{shlex.join(argv)}:\n{r.stdout}{r.stderr}"
