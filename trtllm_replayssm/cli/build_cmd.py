"""`trtllm-replayssm build MODEL --gpu GPU -o DIR`: compile kernels and write a TensorRT-LLM serving bundle."""
from __future__ import annotations

from pathlib import Path

import click

from trtllm_replayssm.cli.errors import RunError, bad_value
from trtllm_replayssm.cli.options import (buffer_len_option, gpu_option, spec_tokens_option, state_from_options,
                                          state_options, tp_size_option)


def _progress_display():
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    return Progress(TextColumn("compiling {task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), transient=False)


@click.command("build")
@click.argument("model")
@gpu_option(required=True)
@click.option("-o", "--output", "output", required=True, type=click.Path(path_type=Path),
              help="Bundle directory (must not exist, or be a bundle replaced with --force).")
@tp_size_option
@buffer_len_option
@state_options
@click.option("--max-batch-size", "--max_batch_size", "max_batch_size", default=256, type=int,
              help="Max concurrent sequences.")
@click.option("--gpu-memory-gib", "gpu_memory_gib", default=None, type=float,
              help="GPU memory for the plan in GiB [default: the GPU's].")
@spec_tokens_option
@click.option("--allow-upstream-mtp", "allow_upstream_mtp", is_flag=True,
              help="Build --spec-tokens even where upstream's Mamba-2 MTP replay is known to corrupt state (head_dim "
                   "not a multiple of 32, e.g. Nemotron-3-Nano); refused without it.")
@click.option("--force", is_flag=True,
              help="Replace an existing bundle at OUTPUT (never a directory that is not a bundle).")
def build_cmd(model: str, gpu: str, output: Path, tp_size: int, buffer_len: int, state_format: str | None,
              state_mode: str | None, master_format: str | None, stochastic_rounding: bool, max_batch_size: int,
              gpu_memory_gib: float | None, spec_tokens: int | None, allow_upstream_mtp: bool, force: bool) -> None:
    """Build a serving bundle for MODEL (a preset name or a local HF model directory). Served: plain fp32/fp16/bf16
    state, and for Mamba-2 also stochastic rounding and dual mode with an fp32/fp16/bf16 master; other state options
    are checked, then refused (exit status 1). --spec-tokens: MTP speculative decoding, verified by the module
    (docs/serving.md)."""
    from trtllm_replayssm.serving import bundle, memory_plan, speculative
    from trtllm_replayssm.serving.hf_config import resolve_model
    from trtllm_replayssm.core.targets import resolve_gpu

    try:
        key, arch = resolve_gpu(gpu)
        bundle.check_output_dir(output, force)
        spec = resolve_model(model)
        state = state_from_options(spec.ssm_state_dtype, state_format, state_mode, master_format, stochastic_rounding)
        plan = memory_plan.plan(spec, key, tp_size=tp_size, buffer_len=buffer_len, state=state,
                                max_batch_size=max_batch_size, gpu_memory_gib=gpu_memory_gib, spec_tokens=spec_tokens)
        hazard = speculative.upstream_mtp_warning(spec, plan.spec_tokens, allow_upstream_mtp)
    except ValueError as exc:
        bad_value(exc)
    if reason := bundle.build_refusal(plan.state, plan.spec_tokens):
        raise RunError(reason)
    if hazard:
        click.secho(f"WARNING: {hazard}. Built anyway ({speculative.ALLOW_FLAG}): expect corrupted outputs with "
                    f"speculative decoding on this model.", err=True, fg="red", bold=True)
    model_path = str(Path(model).resolve()) if Path(model).is_dir() else None
    with _progress_display() as progress:
        task = progress.add_task("kernels", total=None)

        def report(done: int, total: int, name: str) -> None:
            progress.update(task, completed=done, total=total, description=name)

        try:
            out = bundle.write_bundle(spec, plan, arch, output, model_path=model_path, force=force, progress=report)
        except ValueError as exc:
            bad_value(exc)
    spec_note = "" if plan.spec_tokens is None else " (standard decode; speculative decoding not predicted)"
    click.echo(f"bundle written to {out} for {key} ({arch}); predicted SSM-layer speed-up {plan.step.speedup:.2f}x"
               f"{spec_note}; serve with: trtllm-replayssm serve {out}")
