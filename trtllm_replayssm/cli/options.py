"""Options several commands share, declared once (kebab-case, with TensorRT-LLM's snake_case spelling as an alias
where the option mirrors one of its own)."""
from __future__ import annotations

from typing import Callable

import click

from trtllm_replayssm.core.limits import MAX_BUFFER_LEN
from trtllm_replayssm.core.targets import GPU_CHOICES

STATE_DTYPES = ("fp32", "fp16", "bf16")


def gpu_option(required: bool = False, default: str | None = None) -> Callable:
    if required:
        return click.option("--gpu", required=True, help=f"Target GPU: {GPU_CHOICES}.")
    return click.option("--gpu", default=default, help=f"Target GPU: {GPU_CHOICES}.")


tp_size_option = click.option("--tp-size", "--tp_size", "tp_size", default=1, type=int, help="Tensor-parallel size.")
buffer_len_option = click.option("--buffer-len", "buffer_len", default=16,
                                 type=click.IntRange(1, MAX_BUFFER_LEN), help="Ring length L.")
state_dtype_option = click.option("--state-dtype", "state_dtype", default=None, type=click.Choice(STATE_DTYPES),
                                  help="Checkpoint dtype [default: the model's].")
