"""`trtllm-replayssm inspect DIR|MODEL`: the layer plan and memory table of a bundle, preset or model dir."""
from __future__ import annotations

import json
from pathlib import Path

import click

from trtllm_replayssm.cli.build_cmd import fail
from trtllm_replayssm.targets import GPU_TARGETS

MIB = 1 << 20


def _table_from_manifest(m: dict) -> list[tuple[str, str]]:
    mem, pred = m["memory"], m["prediction"]
    per = mem["per_layer_per_seq"]
    return [
        ("model", f"{m['model']['name']} ({m['model']['architecture']})"),
        ("target", f"{m['target']['gpu']} {m['target']['arch']}, TP {m['target']['tp_size']}"),
        ("family / SSM layers", f"{m['plan']['family']} / {len(m['plan']['ssm_layers'])} of "
                                f"{len(m['plan']['layers'])}"),
        ("local heads", ", ".join(f"{k}={v}" for k, v in m["plan"]["local_heads"].items())),
        ("L / state / act", f"{m['buffer_len']} / {m['dtypes']['state']} / {m['dtypes']['activation']}"),
        ("checkpoint / ring per layer+seq", f"{per['checkpoint'] / MIB:.2f} MiB / {per['ring'] / MIB:.3f} MiB"),
        ("per sequence: replay / upstream", f"{mem['per_seq_replay'] / MIB:.1f} MiB / "
                                            f"{mem['per_seq_upstream'] / MIB:.1f} MiB"),
        ("max sequences: replay / upstream", f"{mem['max_concurrent_seqs_replay']} / "
                                             f"{mem['max_concurrent_seqs_upstream']}"),
        ("rings per GPU", f"{mem['ring_bytes_per_gpu'] / MIB:.1f} MiB for {mem['max_batch_size']}+1 slots"),
        ("free_gpu_memory_fraction", str(mem["free_gpu_memory_fraction"])),
        ("predicted SSM-layer speed-up", f"{pred['ssm_layer_speedup']:.2f}x"),
    ]


@click.command("inspect")
@click.argument("target")
@click.option("--gpu", default="h100", show_default=True, help="GPU for a preset/model dir.")
@click.option("--tp-size", default=1, show_default=True, type=int)
@click.option("--buffer-len", default=16, show_default=True, type=int)
@click.option("--state-dtype", default=None)
@click.option("--json", "as_json", is_flag=True, help="Print the manifest-style JSON instead of a table.")
def inspect_cmd(target: str, gpu: str, tp_size: int, buffer_len: int, state_dtype: str | None,
                as_json: bool) -> None:
    """Show the plan and memory table of a bundle directory, a preset, or a local model directory."""
    from rich.console import Console
    from rich.table import Table

    path = Path(target)
    if (path / "manifest.json").is_file():
        m = json.loads((path / "manifest.json").read_text())
    else:
        from trtllm_replayssm import bundle, memory_plan
        from trtllm_replayssm.hf_config import resolve_model

        key = gpu.strip().lower()
        if key not in GPU_TARGETS:
            fail(f"--gpu: unknown GPU {gpu!r}; expected one of {', '.join(sorted(GPU_TARGETS))}")
        try:
            spec = resolve_model(target)
            mp = memory_plan.plan(spec, key, tp_size=tp_size, buffer_len=buffer_len, state_dtype=state_dtype)
        except ValueError as exc:
            fail(str(exc))
        m = bundle.manifest_dict(spec, mp, GPU_TARGETS[key], [], str(path.resolve()) if path.is_dir() else None)
    if as_json:
        click.echo(json.dumps(m, indent=2))
        return
    table = Table(title="ReplaySSM plan", show_header=False)
    for key_, value in _table_from_manifest(m):
        table.add_row(key_, value)
    Console().print(table)
    kinds = "".join({"mamba2": "M", "gdn": "G", "kda": "K", "attention": "*", "mlp": "-", "moe": "E"}[lp["kind"]]
                    for lp in m["plan"]["layers"])
    click.echo(f"layers: {kinds}")
