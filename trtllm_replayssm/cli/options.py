"""Options several commands share, declared once (kebab-case, with TensorRT-LLM's snake_case spelling as an alias
where the option mirrors one of its own)."""
from __future__ import annotations

from typing import TYPE_CHECKING, Callable

import click

from trtllm_replayssm.core.limits import MAX_BUFFER_LEN
from trtllm_replayssm.core.targets import GPU_CHOICES

if TYPE_CHECKING:
    from trtllm_replayssm.core.formats import StateSpec

# The names of core/formats.py, spelled out so that --help does not import torch (tests/test_bundle_cli.py checks).
STATE_FORMATS = ("fp32", "fp16", "bf16", "fp8", "nvfp4")
STATE_MODES = ("plain", "shared", "dual")
MASTER_FORMATS = ("fp32", "fp16", "bf16", "fp8")
QUANT_FORMATS = ("fp8", "nvfp4")


def positive_ints(_ctx: click.Context, _param: click.Parameter, value: str) -> tuple[int, ...]:
    """Click callback: a comma-separated list of positive ints."""
    try:
        out = tuple(int(v) for v in value.split(",") if v.strip())
    except ValueError:
        raise click.BadParameter(f"expected comma-separated positive ints, got {value!r}") from None
    if not out or min(out) < 1:
        raise click.BadParameter(f"expected comma-separated positive ints, got {value!r}")
    return out


def gpu_option(required: bool = False, default: str | None = None) -> Callable:
    if required:
        return click.option("--gpu", required=True, help=f"Target GPU: {GPU_CHOICES}.")
    return click.option("--gpu", default=default, help=f"Target GPU: {GPU_CHOICES}.")


tp_size_option = click.option("--tp-size", "--tp_size", "tp_size", default=1, type=int, help="Tensor-parallel size.")
buffer_len_option = click.option("--buffer-len", "buffer_len", default=16,
                                 type=click.IntRange(1, MAX_BUFFER_LEN), help="Ring length L.")
spec_tokens_option = click.option(
    "--spec-tokens", "spec_tokens", default=None, type=int,
    help="Speculative decoding: N draft tokens per verify step (1..7), MTP in the YAML; rings priced for windows of "
         "N + 1 tokens, verified by the module in every SSM layer [default: none].")
_STATE_OPTIONS = (
    click.option("--state-format", "--state-dtype", "state_format", default=None, type=click.Choice(STATE_FORMATS),
                 help="Checkpoint format (dual mode: of the read copy) [default: the model's state dtype]."),
    click.option("--state-mode", "state_mode", default=None, type=click.Choice(STATE_MODES),
                 help="plain: one fp32/fp16/bf16 checkpoint; shared: one fp8/nvfp4 checkpoint; dual: a master "
                      "checkpoint for flushes plus an fp8/nvfp4 read copy for the other steps [default: plain for "
                      "fp32/fp16/bf16, shared for fp8/nvfp4]."),
    click.option("--master-format", "master_format", default=None, type=click.Choice(MASTER_FORMATS),
                 help="Dual mode's master checkpoint [default: fp32]; TensorRT-LLM's pool holds an fp32/fp16/bf16 "
                      "master, an fp8 one is ours."),
    click.option("--stochastic-rounding/--no-stochastic-rounding", "stochastic_rounding", default=False,
                 help="Round checkpoint writes stochastically instead of to nearest."),
)


def state_options(command: Callable) -> Callable:
    """Add --state-format (alias --state-dtype), --state-mode, --master-format and --stochastic-rounding."""
    for option in reversed(_STATE_OPTIONS):
        command = option(command)
    return command


def state_from_options(default_format: str, state_format: str | None, state_mode: str | None,
                       master_format: str | None, stochastic_rounding: bool) -> StateSpec:
    """The checked StateSpec the state options give (``default_format``: the model's); ValueError naming the
    option's parameter (cli/errors.py turns it into the option)."""
    from trtllm_replayssm.core.formats import state_spec

    return state_spec(state_format or default_format, state_mode, master_format, stochastic_rounding)
