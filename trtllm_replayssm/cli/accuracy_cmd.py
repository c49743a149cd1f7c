"""``trtllm-replayssm accuracy``: KL, perplexity and greedy agreement of a state spec against the fp32 baseline
state, teacher-forced over a text (docs/benchmarks.md, accuracy on trained models)."""
from __future__ import annotations

import json
from pathlib import Path

import click

from trtllm_replayssm.cli.errors import bad_value
from trtllm_replayssm.cli.options import buffer_len_option, positive_ints, state_from_options, state_options
from trtllm_replayssm.core.limits import MODES


def _table(doc: dict) -> "object":
    from rich.table import Table

    rec = doc["records"][0]
    table = Table(title=f"{rec['model']} (L = {rec['L']}, {rec['replay_mode']}) vs fp32 baseline state, "
                        f"{doc['environment']['device']}")
    for col in ("state", "tokens", "mean KL", "p99 KL", "PPL", "PPL fp32", "ΔPPL", "greedy agreement"):
        table.add_column(col, justify="right")
    for r in doc["records"]:
        table.add_row(r["label"], f"{r['from_position']}-{r['position']}", f"{r['mean_kl']:.3e}", f"{r['p99_kl']:.3e}",
                      f"{r['ppl']:.4f}", f"{r['ppl_ref']:.4f}", f"{r['delta_ppl_pct']:+.3f}%",
                      f"{r['greedy_agreement']:.2%}")
    return table


@click.command("accuracy")
@click.argument("model", metavar="MODEL")
@state_options
@click.option("--states", default=None,
              help="Comma-separated state labels decoded one after another against one fp32 baseline pass, e.g. "
                   "'fp32,bf16,fp16+sr,nvfp4,nvfp4/dual/fp16' (instead of the four state options).")
@click.option("--tokens", "tokens", required=True, type=int, help="Tokens to decode (bytes of --text).")
@click.option("--text", type=click.Path(exists=True, dir_okay=False), default=None,
              help="UTF-8 text whose bytes are the tokens (e.g. corpus/heldout/persuasion.txt) [default: seeded "
                   "random bytes].")
@click.option("--positions", default="4096,32768,131072", callback=positive_ints,
              help="Report positions: each row summarises the tokens after the previous one (the last row ends at "
                   "--tokens).")
@click.option("--prompt-len", default=16, type=int, help="Tokens prefilled before decoding.")
@buffer_len_option
@click.option("--mode", "replay_mode", type=click.Choice(list(MODES)), default="replay",
              help="Replay op mode of the test state (replay and fused: flush every L steps; flush: every step).")
@click.option("--act-dtype", type=click.Choice(["fp32", "bf16", "fp16"]), default=None, show_default=False,
              help="Activation dtype [default: bf16 on CUDA, fp32 on CPU].")
@click.option("--device", default=None, show_default=False, help="torch device [default: cuda if available, else cpu].")
@click.option("--spec", "spec_tokens", type=int, default=1, show_default=True,
              help="Speculative windows of T tokens for the test state (the last token and the text's next T - 1 "
                   "as drafts; 1: standard decode).")
@click.option("--mean-accept", type=float, default=None,
              help="With --spec: mean accepted tokens per window (1 <= A <= T, the bonus token counted) of the "
                   "seeded acceptance pattern.")
@click.option("--overlap/--no-overlap", default=True, show_default=True,
              help="On CUDA, decode the passes in lockstep, each on its own stream (else one after another).")
@click.option("--graphs/--no-graphs", "use_graph", default=None,
              help="Replay each pass's decode step (or speculative window) from a CUDA graph [default: on CUDA].")
@click.option("--seed", default=0, type=int, help="Seed of random weights (presets), random tokens and acceptance.")
@click.option("-o", "--output", default="accuracy.json", type=click.Path(dir_okay=False),
              help="JSON report; the KL plot goes beside it (.png).")
def accuracy_cmd(model: str, state_format: str | None, state_mode: str | None, master_format: str | None,
                 stochastic_rounding: bool, states: str | None, tokens: int, text: str | None, positions: tuple[int, ...],
                 prompt_len: int, buffer_len: int, replay_mode: str, act_dtype: str | None, device: str | None,
                 spec_tokens: int, mean_accept: float | None, overlap: bool, use_graph: bool | None, seed: int,
                 output: str) -> None:
    """Teacher-forced decode of --tokens byte tokens through MODEL (preset name, config.json or a directory with
    safetensors) with an fp32 state through the baseline op, then with each test state (--state-format/... or the
    list --states) through the replay op. Reports per-segment mean and p99 KL(fp32 ‖ test), perplexity of both and
    greedy-token agreement: a table, OUTPUT (records of kind "accuracy") and a PNG of KL against position. With
    --spec T the test states decode in speculative windows (verify, then commit of a seeded accepted count)."""
    from rich.console import Console
    from rich.progress import Progress

    from trtllm_replayssm.core.formats import parse_state_label
    from trtllm_replayssm.lab.accuracy import AccuracyConfig, plot_kl, read_tokens, run_accuracy
    from trtllm_replayssm.lab.compare import check_models
    from trtllm_replayssm.lab.plotting import PlotUnavailable

    try:
        check_models([model])
        if states is None:
            specs = [state_from_options("fp32", state_format, state_mode, master_format, stochastic_rounding)]
        elif state_format or state_mode or master_format or stochastic_rounding:
            raise ValueError("states: give either --states or the state options (--state-format, --state-mode, "
                             "--master-format, --stochastic-rounding), not both")
        else:
            specs = [parse_state_label(label.strip(), "states") for label in states.split(",") if label.strip()]
            if not specs:
                raise ValueError(f"states: expected comma-separated state labels, got {states!r}")
        configs = [AccuracyConfig(model=model, spec=spec, tokens=tokens, prompt_len=prompt_len,
                                  buffer_len=buffer_len, replay_mode=replay_mode, positions=positions, device=device,
                                  act_dtype=act_dtype, seed=seed, spec_tokens=spec_tokens, mean_accept=mean_accept,
                                  use_graph=use_graph)
                   for spec in specs]
        ids = read_tokens(tokens, text, seed)
        with Progress(console=Console(stderr=True), transient=True) as bar:
            task = bar.add_task(f"decoding {tokens} tokens, {len(specs) + 1} passes",
                                total=(tokens - prompt_len - 1) * (len(specs) + 1))
            doc = run_accuracy(configs, ids, lambda done, _total: bar.update(task, completed=done), overlap)
    except (ValueError, RuntimeError) as err:
        bad_value(err)
    doc["config"]["text"] = text or f"random bytes (seed {seed})"
    out = Path(output)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    console = Console() if Console().is_terminal else Console(width=200)
    console.print(_table(doc))
    console.print(f"decoded {tokens} tokens in {len(doc['kl_curve']) + 1} passes in {doc['decode_seconds']:.1f} s")
    try:
        console.print(f"wrote {out}, {plot_kl([doc], out.with_suffix('.png'))}")
    except PlotUnavailable as err:
        console.print(f"wrote {out}; {err}")
