"""`trtllm-replayssm bench kernels`: the cold-L2 kernel benchmark of our ops against the peers (docs/benchmarks.md)."""
from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path

import click

from trtllm_replayssm.cli.errors import RunError, bad_value

QUICK_BATCHES = [8, 256]
QUICK_STATE_DTYPES = "fp32"


def _csv(value: str) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()]


def _int_csv(_ctx: click.Context, param: click.Parameter, value: str | None) -> list[int] | None:
    if value is None:
        return None
    try:
        out = [int(v) for v in _csv(value)]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {value!r}") from None
    if not out or any(b < 1 for b in out):
        raise click.BadParameter(f"expected positive integers, got {value!r}")
    return out


def _state_dtypes(_ctx: click.Context, _param: click.Parameter, value: str | None) -> list[str] | None:
    """The --state-dtype list: state labels (fp32, bf16, fp8, nvfp4/dual/fp16, bf16+sr, ...)."""
    if value is None:
        return None
    from trtllm_replayssm.core.formats import parse_state_label

    out = _csv(value)
    for label in out:
        try:
            parse_state_label(label, arg="state")
        except (ValueError, TypeError) as exc:
            raise click.BadParameter(str(exc).removeprefix("state: ")) from None
    return out


def _results_path(stem: str, output: Path | None = None) -> Path:
    """``output``, or benchmarks/results/<stem>-<UTC time>.json, with its folder made."""
    if output is None:
        stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%d-%H%M")
        output = Path("benchmarks/results") / f"{stem}-{stamp}.json"
    output.parent.mkdir(parents=True, exist_ok=True)
    return output


def _gpu_run_output(command: str, output: Path | None, stem: str) -> Path:
    """RunError unless a CUDA GPU is here; the results path (:func:`_results_path`)."""
    import torch

    if not torch.cuda.is_available():
        raise RunError(f"bench {command} needs a CUDA GPU (torch.cuda.is_available() is False); run it on the GPU host")
    return _results_path(stem, output)


@click.group("bench")
def bench_cmd() -> None:
    """Benchmarks (kernel level)."""


@bench_cmd.command("kernels")
@click.option("--family", "families", default="mamba2,gdn,kda", show_default=True,
              help="Comma-separated families: mamba2, gdn, kda.")
@click.option("--models", default=None, help="Comma-separated model presets (default: every benchmark model).")
@click.option("--batch", "batches", default=None, callback=_int_csv, show_default=False,
              help="Comma-separated batch sizes [default: 1,2,4,8,16,32,64,256,512; --quick: 8,256].")
@click.option("--state-dtype", "--state-format", "state_dtypes", default=None, callback=_state_dtypes,
              show_default=False,
              help="Comma-separated states: fp32, fp16, bf16, fp8, nvfp4, FORMAT/dual/MASTER and +sr (e.g. "
                   "nvfp4/dual/fp16) [default: fp32,bf16; --quick: fp32].")
@click.option("--buffer-len", default=16, show_default=True, type=int, help="Ring length L (FlashInfer window).")
@click.option("--peers/--no-peers", default=True, show_default=True, help="Also time FlashInfer, mamba-ssm, fla-core.")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False, path_type=Path), show_default=False,
              help="Results JSON [default: benchmarks/results/kernels-<UTC time>.json]; .md and .png written beside.")
@click.option("--quick", is_flag=True, help="Fewer cases (defaults above) for a smoke run.")
@click.option("--after-plain-kernel", is_flag=True,
              help="Each timed call follows a plainly launched elementwise kernel (as a model's conv1d or norm "
                   "precedes its SSM op); that kernel's own time, timed alone, is subtracted.")
@click.option("--after-conv", is_flag=True,
              help="Each timed call follows our conv1d decode step over the layer's conv channels, which lets the "
                   "next kernel launch early (what the TensorRT-LLM module runs before the decode op of a pure-decode "
                   "batch: with the default launch, its served case); its own time, timed alone, is subtracted.")
@click.option("--served-launch", is_flag=True,
              help="Plan our ops as the TensorRT-LLM module does behind upstream's conv1d (the state kernels launched "
                   "plainly, not as programmatic dependents of the kernel before them); with --after-plain-kernel "
                   "this is the served case of a mixed batch's Mamba-2 decode rows.")
@click.option("--spec", "spec_tokens", default=None, callback=_int_csv,
              help="Speculative verify instead: comma-separated window sizes T (1 + drafts, <= 8), e.g. 2,4,8; times "
                   "the replay verify against the per-draft-state verify per verify step (commit included), and "
                   "with --peers FlashInfer's checkpointing_ssu and per-draft selective_state_update (Mamba-2) and "
                   "fla-core's per-draft verify (GDN, KDA); every family, one plain state dtype.")
def kernels(families: str, models: str | None, batches: list[int] | None, state_dtypes: list[str] | None,
            buffer_len: int, peers: bool, output: Path | None, quick: bool, after_plain_kernel: bool,
            after_conv: bool, served_launch: bool, spec_tokens: list[int] | None) -> None:
    """Time replay / baseline / peers per model, state dtype and batch; write JSON + markdown + plot."""
    from trtllm_replayssm.lab.bench.kernels import DEFAULT_BATCHES, KernelBenchConfig, run_kernel_bench
    from trtllm_replayssm.lab.bench.ours import DEFAULT_TUNING
    from trtllm_replayssm.serving.trtllm.model_cache import SERVING_TUNING
    from trtllm_replayssm.lab.bench.report import write_reports
    from trtllm_replayssm.lab.plotting import PLOT_EXTRA

    if batches is None:
        batches = list(QUICK_BATCHES if quick else DEFAULT_BATCHES)
    if after_plain_kernel and after_conv:
        bad_value(ValueError("--after-conv: not with --after-plain-kernel (each call follows one kernel)"))
    if spec_tokens is not None:
        flags = [f for f, on in (("--after-plain-kernel", after_plain_kernel), ("--after-conv", after_conv),
                                 ("--served-launch", served_launch)) if on]
        if flags:
            bad_value(ValueError(f"{flags[0]}: not with --spec (the verify benchmark times steps as they are)"))
        _spec_kernels(families, models, batches, state_dtypes or ["fp32"], buffer_len, spec_tokens, peers, output)
        return
    dtypes = state_dtypes or _csv(QUICK_STATE_DTYPES if quick else "fp32,bf16")
    try:
        config = KernelBenchConfig(families=_csv(families), models=_csv(models) if models else None,
                                   batches=batches, state_dtypes=dtypes, buffer_len=buffer_len, peers=peers,
                                   neighbour="plain" if after_plain_kernel else "conv" if after_conv else None,
                                   tuning=SERVING_TUNING if served_launch else DEFAULT_TUNING)
    except ValueError as exc:
        bad_value(exc)
    output = _gpu_run_output("kernels", output, "kernels")

    def save_partial(partial: dict) -> None:  # a crash mid-run keeps the cases done so far
        output.write_text(json.dumps(partial, indent=1))

    results = run_kernel_bench(config, log=click.echo, progress=save_partial)
    jp, md, png = write_reports(results, output)
    click.echo(md.read_text())
    click.echo(f"wrote {jp}, {md}" + (f", {png}" if png else f" (no plot: {PLOT_EXTRA} gives it)"))


def _spec_kernels(families: str, models: str | None, batches: list[int], state_dtypes: list[str], buffer_len: int,
                  spec_tokens: list[int], peers: bool, output: Path | None) -> None:
    from trtllm_replayssm.lab.bench.spec import run_spec_bench, summary

    if len(state_dtypes) != 1 or state_dtypes[0] not in ("fp32", "fp16", "bf16"):
        raise click.BadParameter(f"--spec takes one plain state dtype (fp32, fp16, bf16), got {state_dtypes}",
                                 param_hint="--state-dtype")
    output = _gpu_run_output("kernels", output, "kernels-spec")

    def save_partial(partial: dict) -> None:
        output.write_text(json.dumps(partial, indent=1))

    try:
        results = run_spec_bench(_csv(families), _csv(models) if models else None, batches, spec_tokens,
                                 state_dtypes[0], buffer_len, peers=peers, log=click.echo, progress=save_partial)
    except ValueError as exc:
        bad_value(exc)
    output.write_text(json.dumps(results, indent=1))
    table = summary(results)
    output.with_suffix(".md").write_text(table + "\n")
    click.echo(table)
    click.echo(f"wrote {output}, {output.with_suffix('.md')}")


@bench_cmd.command("drift")
@click.option("--model", default="nemotron-3-nano-4b", show_default=True, help="A model preset (any family).")
@click.option("--specs", default=None, help="Comma-separated state specs (format, format/dual/master, +sr for "
              "stochastic rounding), e.g. fp32,nvfp4,nvfp4/dual/fp16+sr [default: twelve formats and modes].")
@click.option("--steps", default=131072, show_default=True, type=int, help="Decode steps.")
@click.option("--batch", default=4, show_default=True, type=int, help="Sequences decoded side by side.")
@click.option("--buffer-len", default=16, show_default=True, type=int, help="Ring length L.")
@click.option("--state-every", default=1024, show_default=True, type=int,
              help="Measure the checkpoints every this many steps (a multiple of L dividing --steps).")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", default="cuda", show_default=True, type=click.Choice(["cuda", "cpu"]),
              help="cuda: CUDA-graph replays of the kernels; cpu: the references, eagerly (every family and spec, "
                   "slowly).")
@click.option("-o", "--output", default=None, type=click.Path(dir_okay=False, path_type=Path), show_default=False,
              help="Results JSON [default: benchmarks/results/drift-<model>-<UTC time>.json]; a .png beside it.")
def drift(model: str, specs: str | None, steps: int, batch: int, buffer_len: int, state_every: int, seed: int,
          device: str, output: Path | None) -> None:
    """Long-run error of each checkpoint spec against a float64 recurrence (state after flushes, outputs)."""
    import torch

    from trtllm_replayssm.lab.drift import DEFAULT_SPECS, DriftConfig, plot_drift, run_drift
    from trtllm_replayssm.lab.plotting import PLOT_EXTRA, PlotUnavailable

    try:
        config = DriftConfig(model=model, specs=tuple(_csv(specs)) if specs else DEFAULT_SPECS, steps=steps,
                             batch=batch, buffer_len=buffer_len, state_every=state_every, seed=seed)
    except (ValueError, TypeError) as exc:
        bad_value(exc)
    if device == "cuda":
        output = _gpu_run_output("drift", output, f"drift-{model}")
    else:
        output = _results_path(f"drift-{model}", output)
    doc = run_drift(config, device, progress=lambda done, total: click.echo(f"  step {done}/{total}", err=True)
                    if done % (total // 8 or 1) == 0 else None)
    output.write_text(json.dumps(doc, indent=1))
    click.echo(f"{'spec':22s} {'state err (last)':>17s} {'state err (max)':>16s} {'output err (median)':>20s}")
    for rec in doc["records"]:
        out_med = sorted(rec["output_rel_err_median"])[len(rec["output_rel_err_median"]) // 2]
        click.echo(f"{rec['label']:22s} {rec['state_rel_err'][-1]:17.3e} {max(rec['state_rel_err']):16.3e} "
                   f"{out_med:20.3e}")
    try:
        png = output.with_suffix(".png")
        plot_drift(doc, png)
        click.echo(f"wrote {output}, {png}")
    except PlotUnavailable:
        click.echo(f"wrote {output} (no plot: {PLOT_EXTRA} gives it)")
