"""`trtllm-replayssm serve DIR [--model PATH] [-- extra trtllm-serve args]`: run trtllm-serve with the bundle."""
from __future__ import annotations

import json
import os
import shlex
import shutil
from pathlib import Path

import click

from trtllm_replayssm.cli.errors import RunError, fail

INSTALL_HINT = "pip install tensorrt-llm==1.4.0rc1 (needs CUDA 13 and torch 2.14; see docs/serving.md)"


def serve_command(bundle_dir: Path, model: str, extra: tuple[str, ...]) -> list[str]:
    """The trtllm-serve argv for ``bundle_dir``."""
    d = bundle_dir.resolve()
    return ["trtllm-serve", model, "--extra_llm_api_options", str(d / "trtllm-serve.yaml"),
            "--custom_module_dirs", str(d / "trtllm_module"), *extra]


@click.command("serve", context_settings={"ignore_unknown_options": True})
@click.argument("bundle_dir", type=click.Path(path_type=Path))
@click.option("--model", default=None, help="Model path or HF id (default: the path recorded at build time).")
@click.option("--dry-run", is_flag=True, help="Print the command instead of running it.")
@click.argument("extra", nargs=-1, type=click.UNPROCESSED)
def serve_cmd(bundle_dir: Path, model: str | None, dry_run: bool, extra: tuple[str, ...]) -> None:
    """Serve a bundle with trtllm-serve (extra arguments after -- go to trtllm-serve)."""
    manifest = bundle_dir / "manifest.json"
    if not manifest.is_file():
        fail(f"BUNDLE_DIR: {str(bundle_dir)!r} is not a bundle (no manifest.json); create one with "
             f"`trtllm-replayssm build`")
    recorded = json.loads(manifest.read_text())["model"].get("path")
    model = model or recorded
    if not model:
        fail("--model: this bundle was built from a preset; pass --model with the checkpoint path or HF id")
    argv = serve_command(bundle_dir, model, extra)
    if dry_run:
        click.echo(shlex.join(argv))
        return
    if shutil.which("trtllm-serve") is None:
        raise RunError(f"trtllm-serve not found: TensorRT-LLM is not installed here; {INSTALL_HINT}")
    os.execvp(argv[0], argv)
