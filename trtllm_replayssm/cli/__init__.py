"""`trtllm-replayssm` command line: a click group whose subcommands live in their own modules (loaded lazily)."""
from __future__ import annotations

import importlib

import click

# command name -> "module:attribute"; modules are imported only when their command runs (fast --help, no torch import).
_COMMANDS = {
    "compile": "trtllm_replayssm.cli.compile_cmd:compile_cmd",
    "build": "trtllm_replayssm.cli.build_cmd:build_cmd",
    "serve": "trtllm_replayssm.cli.serve_cmd:serve_cmd",
    "inspect": "trtllm_replayssm.cli.inspect_cmd:inspect_cmd",
    "bench": "trtllm_replayssm.cli.bench_cmd:bench_cmd",
    "compare": "trtllm_replayssm.cli.compare_cmd:compare_cmd",
}


class _LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="trtllm-replayssm")
def main() -> None:
    """ReplaySSM decode kernels for hybrid LLMs in TensorRT-LLM."""
