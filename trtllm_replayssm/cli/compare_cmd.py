"""``trtllm-replayssm compare``: whole-model decode-step latency, baseline SSM op vs ReplaySSM; with ``--spec``
also speculative verify steps, per-draft-state vs replay verify (the PyTorch reference path, on the CPU)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from trtllm_replayssm.cli.errors import Interrupted, RunError, bad_value
from trtllm_replayssm.cli.options import positive_ints
from trtllm_replayssm.core.limits import MAX_BUFFER_LEN, MODES


def _tokens_cell(check: dict) -> str:
    if not check:
        return "-"
    if check["tokens_equal"]:
        return "yes"
    if check["mismatch_rows"]:
        return f"NO ({check['mismatch_rows']}/{check['rows']} rows)"
    return f"yes, {check['near_tie_rows']} near-tie rows"


def _table(report: dict) -> "object":
    from rich.table import Table

    from trtllm_replayssm.lab.compare import speedups

    title = f"decode step, {report['device']} ({report['engine']})"
    if not report.get("complete", True):
        title += " - stopped early, partial results"
    table = Table(title=title)
    for col in ("model", "layers", "batch", "baseline µs", "replay µs", "speed-up", "baseline tok/s", "replay tok/s",
                "SSM share base", "SSM share replay", "tokens equal", "max |Δlogits|"):
        table.add_column(col, justify="left" if col in ("model", "layers") else "right")
    checks = {(c["model"], c["batch"], c.get("spec_tokens", 1)): c for c in report["checks"]}
    for r in speedups(report["records"]):
        c = checks.get((r["model"], r["batch"], 1), {})
        table.add_row(r["model"], r["layers"], str(r["batch"]), f"{r['baseline_us']:.1f}", f"{r['replay_us']:.1f}",
                      f"{r['speedup']:.3f}x", f"{r['baseline_tok_s']:.0f}", f"{r['replay_tok_s']:.0f}", f"{r['baseline_ssm_share']:.1%}",
                      f"{r['replay_ssm_share']:.1%}", _tokens_cell(c),
                      f"{c.get('max_abs_dlogits', float('nan')):.2e}")
    return table


def _spec_table(report: dict) -> "object":
    from rich.table import Table

    from trtllm_replayssm.lab.compare import spec_speedups

    rows = spec_speedups(report["records"])
    graphed = all(r.get("cuda_graph") for r in report["records"] if r.get("spec_tokens", 1) > 1)
    table = Table(title="speculative verify steps, accepted tokens/s" + ("" if graphed else " (eager steps, no CUDA graphs)"))
    for col in ("model", "layers", "batch", "T", "mean accepted", "per-draft µs", "replay verify µs",
                "per-draft tok/s", "replay verify tok/s", "replay decode tok/s", "vs per-draft", "vs replay decode",
                "tokens equal"):
        table.add_column(col, justify="left" if col in ("model", "layers") else "right")
    checks = {(c["model"], c["batch"], c.get("spec_tokens", 1)): c for c in report["checks"]}
    for r in rows:
        c = checks.get((r["model"], r["batch"], r["spec_tokens"]), {})
        table.add_row(r["model"], r["layers"], str(r["batch"]), str(r["spec_tokens"]), f"{r['mean_accept']:.2f}",
                      f"{r['per_draft_us']:.1f}", f"{r['verify_us']:.1f}", f"{r['per_draft_tok_s']:.0f}",
                      f"{r['verify_tok_s']:.0f}", f"{r['decode_tok_s']:.0f}", f"{r['vs_per_draft']:.3f}x",
                      f"{r['vs_decode']:.3f}x", _tokens_cell(c))
    return table


def _bench_table(bench: dict) -> "object":
    from rich.table import Table

    table = Table(title=f"trtllm-bench, {bench['device']} (metrics as reported)")
    for col in ("model", "impl", "batch", "mode", "metrics"):
        table.add_column(col, justify="right" if col == "batch" else "left")
    for r in bench["records"]:
        metrics = ", ".join(f"{k}={v:.4g}" for k, v in sorted(r["metrics"].items())) or "see report"
        table.add_row(r["model"], r["impl"], str(r["batch"]), r["mode"], metrics)
    return table


@click.command("compare")
@click.argument("models", nargs=-1, required=True, metavar="MODEL...")
@click.option("--batch", "batches", default="1,8,64,256,512", callback=positive_ints, help="Comma-separated batch sizes.")
@click.option("--steps", default=64, type=int,
              help="Decode steps per batch (>= 3 * buffer-len for the fp32 token check).")
@click.option("--gpu-layers", type=int, default=None,
              help="Run a contiguous slice of K layers (the real layer pattern) of a model too large for one GPU.")
@click.option("--state-dtype", type=click.Choice(["fp32", "fp16", "bf16"]), default="fp32")
@click.option("--act-dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default=None, show_default=False,
              help="Activation dtype [default: bf16 on CUDA, fp32 on CPU].")
@click.option("--buffer-len", "-L", default=16, type=click.IntRange(1, MAX_BUFFER_LEN), help="Ring length L.")
@click.option("--prompt-len", default=16, type=int)
@click.option("--mode", "replay_mode", type=click.Choice(list(MODES)), default="auto",
              help="Replay op mode (auto: the planner's choice per batch; fused: the replay in one launch; flush: "
                   "every step flushes).")
@click.option("--spec", "spec_tokens", type=int, default=None,
              help="Also run speculative verify steps of T tokens per row (2..8: the last token and T-1 drafts), "
                   "per-draft-state vs replay verify (the CUDA kernels on a GPU).")
@click.option("--mean-accept", type=float, default=None,
              help="With --spec: the mean accepted tokens per window (1 <= A <= T, the bonus token counted) of the "
                   "synthetic acceptance pattern.")
@click.option("--seed", default=0, type=int, show_default=True,
              help="Seed of the random weights, prompts, drafts and acceptance pattern.")
@click.option("--device", default=None, show_default=False, help="torch device [default: cuda if available, else cpu].")
@click.option("--bundle", type=click.Path(exists=True, file_okay=False), default=None,
              help="Bundle from `trtllm-replayssm build`: with TensorRT-LLM installed, also run trtllm-bench.")
@click.option("-o", "--out-dir", default="compare_out", type=click.Path(file_okay=False))
def compare_cmd(models: tuple[str, ...], batches: tuple[int, ...], steps: int, gpu_layers: int | None,
                state_dtype: str, act_dtype: str | None, buffer_len: int, prompt_len: int, replay_mode: str,
                spec_tokens: int | None, mean_accept: float | None, seed: int, device: str | None,
                bundle: str | None, out_dir: str) -> None:
    """Decode-step latency of MODEL (preset name, config.json or HF model directory) with the baseline SSM op and
    with ReplaySSM: table, OUT_DIR/compare.json (rewritten after every batch, so a stopped run keeps what it
    measured) and OUT_DIR/compare_speedup.png. On a CPU the timings are of the PyTorch fallback ops, not of the
    GPU kernels; try `compare tiny-nemotron tiny-qwen --batch 1,8 --steps 48` there. With --spec T --mean-accept A
    each batch also runs STEPS speculative verify steps (random drafts, a seeded acceptance pattern of mean A, the
    same for both) with per-draft states and with the replay verify, and reports accepted tokens/s."""
    from rich.console import Console

    from trtllm_replayssm.cli.progress import compare_progress
    from trtllm_replayssm.lab.compare import (CPU_FALLBACK_NOTE, CompareSettings, TokenMismatchError, check_models, run_compare,
                                          run_trtllm_bench, trtllm_available)

    console = Console() if Console().is_terminal else Console(width=200)
    status = Console(stderr=True, soft_wrap=True)
    try:
        settings = CompareSettings(batches=batches, steps=steps, state_dtype=state_dtype, act_dtype=act_dtype,
                                   buffer_len=buffer_len, prompt_len=prompt_len, gpu_layers=gpu_layers,
                                   device=device, seed=seed, replay_mode=replay_mode, spec_tokens=spec_tokens,
                                   mean_accept=mean_accept)
        cpu = settings.torch_device.type == "cpu"
        check_models(list(models))
    except (ValueError, RuntimeError) as err:
        bad_value(err)
    if cpu:
        status.print(f"[bold yellow]warning[/]: {CPU_FALLBACK_NOTE}")
    json_path = Path(out_dir) / "compare.json"
    mismatch = None
    try:
        with compare_progress(status) as progress:
            report = run_compare(list(models), settings, out_dir, progress=progress)
    except TokenMismatchError as err:
        mismatch = err
        report = json.loads(json_path.read_text())
    except KeyboardInterrupt:
        if json_path.is_file():
            console.print(_table(json.loads(json_path.read_text())))
            raise Interrupted(f"interrupted; what was measured is in {json_path}") from None
        raise
    except ValueError as err:
        bad_value(err)
    console.print(_table(report))
    if report.get("spec_note"):
        console.print(_spec_table(report))
    for model, notes in report["notes"].items():
        for note in notes:
            console.print(f"[dim]{model}: {note}[/dim]")
    if bundle and trtllm_available():
        for model in models:
            bench = run_trtllm_bench(model, bundle, batches, Path(out_dir) / "trtllm")
            path = Path(out_dir) / "trtllm" / f"{Path(model).name}_trtllm_bench.json"
            path.write_text(json.dumps(bench, indent=2) + "\n")
            console.print(_bench_table(bench))
            console.print(f"trtllm-bench reports: {path}")
    else:
        why = "no --bundle given" if not bundle else "TensorRT-LLM is not installed"
        console.print(f"Ran the reference decoder ({why}); trtllm-bench was not run.")
    console.print(f"wrote {', '.join(report['files'])}")
    if "plot_note" in report:
        click.echo(report["plot_note"], err=True)
    if cpu:
        status.print(f"[bold yellow]warning[/]: {CPU_FALLBACK_NOTE}")
    if mismatch is not None:
        raise RunError(str(mismatch))
