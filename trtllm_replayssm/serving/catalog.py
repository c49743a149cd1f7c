"""The kernel modules the toolkit ships: every preset's configs for the supported state/activation dtypes."""
from __future__ import annotations

from typing import Iterable

import torch

from trtllm_replayssm.core.jit.configs import KernelConfig, configs_for_spec, unique

# (state dtype, activation dtype) pairs compiled ahead of time.
DTYPE_PAIRS: tuple[tuple[torch.dtype, torch.dtype], ...] = (
    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.float32, torch.float16),
)


def catalog_configs(presets: Iterable[str] | None = None,
                    dtype_pairs: Iterable[tuple[torch.dtype, torch.dtype]] = DTYPE_PAIRS) -> list[KernelConfig]:
    """Configs of the named presets (default: all) for each (state, activation) dtype pair."""
    from trtllm_replayssm.serving.presets import get_preset, list_presets

    names = list(presets) if presets is not None else list_presets()
    unknown = [n for n in names if n.strip().lower() not in list_presets()]
    if unknown:
        raise ValueError(f"presets: unknown preset {unknown}; expected names from {list_presets()}")
    pairs = list(dtype_pairs)
    return unique(cfg for name in names for state, act in pairs
                  for cfg in configs_for_spec(get_preset(name), state, act))
