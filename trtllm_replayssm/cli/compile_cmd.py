"""``trtllm-replayssm compile``: compile the kernels ahead of time for a target GPU (works without a GPU)."""
from __future__ import annotations

from pathlib import Path

import click
from rich.console import Console
from rich.progress import Progress

from trtllm_replayssm.targets import GPU_TARGETS, resolve_target


@click.command("compile")
@click.option("--gpu", "gpu", required=True, help=f"target GPU: {', '.join(sorted(GPU_TARGETS))} (or an sm_XXa arch)")
@click.option("--preset", "presets", multiple=True, help="only the kernels of these model presets (default: all)")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="also copy the cubins into this directory (default: only the on-disk cache)")
def compile_cmd(gpu: str, presets: tuple[str, ...], output: Path | None) -> None:
    """Compile every kernel module for GPU with NVRTC into the cubin cache (and OUTPUT)."""
    from trtllm_replayssm.kernels.catalog import catalog_configs, compile_all, resource_usage

    try:
        arch = resolve_target(gpu)
        configs = catalog_configs(presets or None)
    except (ValueError, KeyError) as exc:
        raise click.UsageError(str(exc).strip("'\"")) from None
    console = Console()
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"NVRTC {arch}", total=len(configs))
        compiled = compile_all(configs, arch, output, progress=lambda cfg: bar.advance(task))
    spills = [(c.config.name, u) for c in compiled for u in resource_usage(c.log) if u.spill_bytes]
    console.print(f"compiled {len(compiled)} kernel modules for {arch}" + (f" into {output}" if output else ""))
    for name, usage in spills:
        console.print(f"[yellow]warning[/]: {name}:{usage.kernel} spills {usage.spill_bytes} bytes")
