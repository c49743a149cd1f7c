"""`trtllm-replayssm inspect DIR|MODEL`: the layer plan and memory table of a bundle, preset or model dir."""
from __future__ import annotations

import json
from pathlib import Path

import click

from trtllm_replayssm.cli.errors import bad_value
from trtllm_replayssm.cli.options import (buffer_len_option, gpu_option, spec_tokens_option, state_from_options,
                                          state_options, tp_size_option)

MIB = 1 << 20
# One letter per layer kind in the printed layer pattern.
LAYER_LETTERS = {"mamba2": "M", "gdn": "G", "kda": "K", "attention": "*", "mlp": "-", "moe": "E"}
LAYER_KEY = "M Mamba-2, G Gated DeltaNet, K KDA, * attention, - MLP, E MoE"
PLAN_OPTIONS = ("gpu", "tp_size", "buffer_len", "spec_tokens", "state_format", "state_mode", "master_format",
                "stochastic_rounding")


def _table_from_manifest(m: dict) -> list[tuple[str, str]]:
    mem, pred = m["memory"], m["prediction"]
    per, state = mem["per_layer_per_seq"], m["state"]
    holds = state["trtllm_pool_holds"]
    if holds == "codes":  # of the shared checkpoint or of the dual master
        holds = f"{state['master_format'] or state['state_format']} codes"
    pool = f"{state['trtllm_pool_dtype']}, holds our {holds}"
    rows = [
        ("model", f"{m['model']['name']} ({m['model']['architecture']})"),
        ("target", f"{m['target']['gpu']} {m['target']['arch']}, TP {m['target']['tp_size']}"),
        ("family / SSM layers", f"{m['plan']['family']} / {len(m['plan']['ssm_layers'])} of "
                                f"{len(m['plan']['layers'])}"),
        ("local heads", ", ".join(f"{k}={v}" for k, v in m["plan"]["local_heads"].items())),
        ("L / state / act", f"{m['buffer_len']} / {m['dtypes']['state']} / {m['dtypes']['activation']}"),
        ("state", state["summary"]),
        ("TensorRT-LLM SSM pool", pool),
        ("checkpoint / ring per layer+seq", f"{per['checkpoint'] / MIB:.2f} MiB / {per['ring'] / MIB:.3f} MiB"),
        ("state per layer+seq: TensorRT-LLM / ours", f"{per['upstream_state'] / MIB:.2f} MiB / "
                                                     f"{per['our_state'] / MIB:.2f} MiB"),
        ("per sequence: replay / upstream", f"{mem['per_seq_replay'] / MIB:.1f} MiB / "
                                            f"{mem['per_seq_upstream'] / MIB:.1f} MiB"),
        ("max sequences: replay / upstream", f"{mem['max_concurrent_seqs_replay']} / "
                                             f"{mem['max_concurrent_seqs_upstream']} (recurrent state in all of the "
                                             f"GPU memory; excludes weights, KV cache, activations)"),
        ("our cache per GPU", f"{mem['reserve_bytes_per_gpu'] / MIB:.1f} MiB for {mem['max_batch_size']}+1 slots "
                              f"(rings and cursors {mem['ring_bytes_per_gpu'] / MIB:.1f} MiB)"),
        ("free_gpu_memory_fraction", str(mem["free_gpu_memory_fraction"])),
        ("predicted SSM-layer speed-up", f"{pred['ssm_layer_speedup']:.2f}x"),
    ]
    rows += [("TensorRT-LLM note", state["trtllm_note"])] if state["trtllm_note"] else []
    return rows + _speculative_rows(m.get("speculative"))


def _speculative_rows(spec: dict | None) -> list[tuple[str, str]]:
    """The table rows of the manifest's ``speculative`` (none without speculative decoding)."""
    if spec is None:
        return []
    rows = [("speculative decoding", f"MTP, {spec['spec_tokens']} draft tokens (windows of {spec['window_tokens']}); "
                                     f"rings of {spec['ring_len']} records"),
            ("speculative decoding served by", f"{spec['served_by']}: {spec['note']}")]
    return rows + ([("WARNING upstream MTP", spec["upstream_mtp_hazard"])] if spec["upstream_mtp_hazard"] else [])


def layer_pattern(layers: list[dict]) -> str:
    """The layer kinds as one letter each (see LAYER_KEY)."""
    return "".join(LAYER_LETTERS[lp["kind"]] for lp in layers)


@click.command("inspect")
@click.argument("target")
@gpu_option(default="h100")
@tp_size_option
@buffer_len_option
@spec_tokens_option
@state_options
@click.option("--json", "as_json", is_flag=True, help="Print the manifest-style JSON instead of a table.")
@click.pass_context
def inspect_cmd(ctx: click.Context, target: str, gpu: str, tp_size: int, buffer_len: int, spec_tokens: int | None,
                state_format: str | None, state_mode: str | None, master_format: str | None, stochastic_rounding: bool,
                as_json: bool) -> None:
    """Show the plan and memory table of a bundle directory, a preset, or a local model directory. For a bundle
    the plan it was built with is shown; --gpu, --tp-size, --buffer-len, --spec-tokens and the state options apply to
    presets and model directories, where every state format and mode is planned (build compiles plain
    fp32/fp16/bf16)."""
    from rich.console import Console
    from rich.table import Table

    path = Path(target)
    if (path / "manifest.json").is_file():
        m = json.loads((path / "manifest.json").read_text())
        given = [p.opts[0] for p in ctx.command.params if p.name in PLAN_OPTIONS
                 and ctx.get_parameter_source(p.name) is click.core.ParameterSource.COMMANDLINE]
        if given:
            click.echo(f"warning: {', '.join(given)} ignored: {target} is a bundle built for "
                       f"{m['target']['gpu']} ({m['target']['arch']}), TP {m['target']['tp_size']}, "
                       f"L={m['buffer_len']}; rebuild it to plan otherwise", err=True)
    else:
        from trtllm_replayssm.serving import bundle, memory_plan
        from trtllm_replayssm.serving.hf_config import resolve_model
        from trtllm_replayssm.core.targets import resolve_gpu

        try:
            key, arch = resolve_gpu(gpu)
            spec = resolve_model(target)
            state = state_from_options(spec.ssm_state_dtype, state_format, state_mode, master_format,
                                       stochastic_rounding)
            mp = memory_plan.plan(spec, key, tp_size=tp_size, buffer_len=buffer_len, state=state,
                                  spec_tokens=spec_tokens)
        except ValueError as exc:
            bad_value(exc)
        m = bundle.manifest_dict(spec, mp, arch, [], str(path.resolve()) if path.is_dir() else None)
    if as_json:
        click.echo(json.dumps(m, indent=2))
        return
    table = Table(title="ReplaySSM plan", show_header=False)
    for key_, value in _table_from_manifest(m):
        table.add_row(key_, value)
    Console().print(table)
    click.echo(f"layers: {layer_pattern(m['plan']['layers'])}  ({LAYER_KEY})")
