"""``trtllm-replayssm compile``: compile the kernels ahead of time for a target GPU (works without a GPU)."""
from __future__ import annotations

from pathlib import Path

import click

from trtllm_replayssm.cli.errors import bad_value
from trtllm_replayssm.cli.options import gpu_option


@click.command("compile")
@gpu_option(required=True)
@click.option("--preset", "presets", multiple=True, help="Only the kernels of these model presets [default: all].")
@click.option("-o", "--output", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Also copy the cubins into this directory [default: only the kernel cache].")
def compile_cmd(gpu: str, presets: tuple[str, ...], output: Path | None) -> None:
    """Compile the SSM decode kernel modules of every preset (or of --preset) for GPU with NVRTC into the kernel
    cache ($TRTLLM_REPLAYSSM_CACHE, default ~/.cache/trtllm_replayssm). The reference decoders' layer kernels are
    not included: they compile on first use."""
    from rich.console import Console
    from rich.progress import Progress

    from trtllm_replayssm.core.jit.compiler import compile_all, resource_usage
    from trtllm_replayssm.serving.catalog import catalog_configs
    from trtllm_replayssm.core.jit.compiler import cache_dir
    from trtllm_replayssm.core.targets import resolve_target

    try:
        arch = resolve_target(gpu)
        configs = catalog_configs(presets or None)
    except ValueError as exc:
        bad_value(exc)
    click.echo(f"kernel cache: {cache_dir() / arch}", err=True)
    console = Console(stderr=True)
    with Progress(console=console, transient=True) as bar:
        task = bar.add_task(f"NVRTC {arch}", total=len(configs))
        compiled = compile_all(configs, arch, output, progress=lambda cfg: bar.advance(task))
    spills = [(c.config.name, u) for c in compiled for u in resource_usage(c.log) if u.spill_bytes]
    click.echo(f"compiled {len(compiled)} kernel modules for {arch} into {cache_dir() / arch}"
               + (f" and {output}" if output else ""))
    for name, usage in spills:
        click.echo(f"warning: {name}:{usage.kernel} spills {usage.spill_bytes} bytes", err=True)
