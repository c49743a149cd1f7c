"""`trtllm-replayssm` command line: a click group whose subcommands live in their own modules (loaded lazily)."""
from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from trtllm_replayssm.cli.errors import INPUT_ERROR, INTERRUPTED, one_line, usage_line

# command name -> "module:attribute"; modules are imported only when their command runs (fast --help, no torch import).
_COMMANDS = {
    "compile": "trtllm_replayssm.cli.compile_cmd:compile_cmd",
    "build": "trtllm_replayssm.cli.build_cmd:build_cmd",
    "serve": "trtllm_replayssm.cli.serve_cmd:serve_cmd",
    "inspect": "trtllm_replayssm.cli.inspect_cmd:inspect_cmd",
    "bench": "trtllm_replayssm.cli.bench_cmd:bench_cmd",
    "compare": "trtllm_replayssm.cli.compare_cmd:compare_cmd",
    "accuracy": "trtllm_replayssm.cli.accuracy_cmd:accuracy_cmd",
}


class _LazyGroup(click.Group):
    """Loads subcommands on demand and prints every error as one ``error:`` line (cli/errors.py)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(_COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = _COMMANDS.get(cmd_name)
        if target is None:
            return None
        module_name, attr = target.split(":")
        return getattr(importlib.import_module(module_name), attr)

    def main(self, args: Any = None, prog_name: str | None = None, complete_var: str | None = None,
             standalone_mode: bool = True, **extra: Any) -> Any:
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as exc:
            click.echo(f"error: {one_line(usage_line(exc))}", err=True)
            sys.exit(INPUT_ERROR)
        except click.ClickException as exc:
            click.echo(f"error: {one_line(exc.format_message())}", err=True)
            sys.exit(exc.exit_code)
        except click.Abort:
            click.echo("error: interrupted", err=True)
            sys.exit(INTERRUPTED)
        sys.exit(rv if isinstance(rv, int) else 0)


@click.group(cls=_LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "show_default": True})
@click.version_option(package_name="trtllm-replayssm")
def main() -> None:
    """ReplaySSM decode kernels for hybrid LLMs in TensorRT-LLM.

    Exit status: 0 done, 2 bad input, 1 could not run here (no GPU, compile failure), 130 interrupted.
    """
