"""`trtllm-replayssm build MODEL --gpu GPU -o DIR`: compile kernels and write a TensorRT-LLM serving bundle."""
from __future__ import annotations

from pathlib import Path
from typing import NoReturn

import click

from trtllm_replayssm.targets import GPU_TARGETS


def fail(message: str) -> NoReturn:
    """Print one error line and exit with status 2 (bad input)."""
    click.echo(f"error: {message}", err=True)
    raise SystemExit(2)


def _progress_display():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("compiling {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False)


@click.command("build")
@click.argument("model")
@click.option("--gpu", required=True, help=f"Target GPU: {', '.join(sorted(GPU_TARGETS))}.")
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path), help="Bundle directory.")
@click.option("--tp-size", default=1, show_default=True, type=int, help="Tensor-parallel size.")
@click.option("--buffer-len", default=16, show_default=True, type=int, help="Ring length L (1..64).")
@click.option("--state-dtype", default=None, help="Checkpoint dtype fp32|fp16|bf16 (default: the model's).")
@click.option("--max-batch-size", default=256, show_default=True, type=int, help="Max concurrent sequences.")
@click.option("--gpu-memory-gb", default=None, type=float, help="GPU memory for the plan (default: the GPU's).")
@click.option("--force", is_flag=True, help="Replace an existing output directory.")
def build_cmd(model: str, gpu: str, output: Path, tp_size: int, buffer_len: int, state_dtype: str | None,
              max_batch_size: int, gpu_memory_gb: float | None, force: bool) -> None:
    """Build a serving bundle for MODEL (a preset name or a local HF model directory)."""
    from trtllm_replayssm import bundle, memory_plan
    from trtllm_replayssm.hf_config import resolve_model
    from trtllm_replayssm.targets import resolve_target

    key = gpu.strip().lower()
    if key not in GPU_TARGETS:
        fail(f"--gpu: unknown GPU {gpu!r}; expected one of {', '.join(sorted(GPU_TARGETS))}")
    if output.exists() and not force:
        fail(f"-o: {str(output)!r} exists; pass --force to replace it")
    try:
        spec = resolve_model(model)
        plan = memory_plan.plan(spec, key, tp_size=tp_size, buffer_len=buffer_len, state_dtype=state_dtype,
                                max_batch_size=max_batch_size, gpu_memory_gb=gpu_memory_gb)
    except ValueError as exc:
        fail(str(exc))
    model_path = str(Path(model).resolve()) if Path(model).is_dir() else None
    with _progress_display() as progress:
        task = progress.add_task("kernels", total=None)

        def report(done: int, total: int, name: str) -> None:
            progress.update(task, completed=done, total=total, description=name)

        try:
            out = bundle.write_bundle(spec, plan, resolve_target(key), output, model_path=model_path, force=force,
                                      progress=report)
        except (ValueError, FileExistsError) as exc:
            fail(str(exc))
    click.echo(f"bundle written to {out}  (predicted SSM-layer speed-up {plan.step.speedup:.2f}x; "
               f"serve with: trtllm-replayssm serve {out})")
