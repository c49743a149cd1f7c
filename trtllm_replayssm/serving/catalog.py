"""The kernel modules the toolkit ships: every preset's configs for the supported state/activation dtypes."""
from __future__ import annotations

from typing import Iterable

import torch

from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import StateSpec, parse_state_label, state_spec, torch_dtype
from trtllm_replayssm.core.jit.configs import KernelConfig, unique
from trtllm_replayssm.serving.presets import ModelSpec, get_preset, list_presets

# Stored checkpoint specs the CI kernel gate compiles for GATE_PRESETS (bf16 activations): every master format
# (plain, FP8), read copy (none, FP8, NVFP4) and rounding (nearest, stochastic) the kernels branch on, on the head
# geometries of each family (Mamba-2 80-row heads and two-head tiles, GDN, KDA; an NVFP4 read copy beside a plain
# master without stochastic rounding ships GDN/KDA whole-head modules). A stored bundle compiles its own.
GATE_STATES: tuple[str, ...] = ("fp8", "fp8/dual/fp32", "nvfp4/dual/fp16", "nvfp4/dual/fp16+sr", "nvfp4/dual/fp8+sr")
GATE_PRESETS: tuple[str, ...] = ("nemotron-3-nano-4b", "nemotron-3-super-120b", "qwen3.5-4b", "kimi-linear-48b")

# (state dtype, activation dtype) pairs compiled ahead of time.
DTYPE_PAIRS: tuple[tuple[torch.dtype, torch.dtype], ...] = (
    (torch.float32, torch.bfloat16), (torch.bfloat16, torch.bfloat16), (torch.float16, torch.float16),
    (torch.float32, torch.float16),
)


def spec_configs(spec: ModelSpec, state: str | torch.dtype | StateSpec, act_dtype: str | torch.dtype,
                 tp_size: int = 1) -> list[KernelConfig]:
    """Every kernel module a model can launch at any batch size on one TP rank (all row tiles), for a plain state
    dtype or a stored checkpoint spec (Mamba-2)."""
    dims = spec.ssm_dims.local(tp_size)
    st = state_spec(state, arg="state")
    return family_of(dims).kernel_configs(dims, st if st.stored else torch_dtype(st.format, "state"),
                                          torch_dtype(act_dtype, "act_dtype"))


def catalog_configs(presets: Iterable[str] | None = None,
                    dtype_pairs: Iterable[tuple[torch.dtype, torch.dtype]] = DTYPE_PAIRS) -> list[KernelConfig]:
    """Configs of the named presets (default: all) for each (state, activation) dtype pair."""
    names = list(presets) if presets is not None else list_presets()
    unknown = [n for n in names if n.strip().lower() not in list_presets()]
    if unknown:
        raise ValueError(f"presets: unknown preset {unknown}; expected names from {list_presets()}")
    pairs = list(dtype_pairs)
    return unique(cfg for name in names for state, act in pairs for cfg in spec_configs(get_preset(name), state, act))


def label_configs(presets: Iterable[str], labels: Iterable[str], arg: str = "state") -> list[KernelConfig]:
    """Every module the named presets can launch with each state spec label (``fp32``, ``nvfp4/dual/fp16``, ...),
    bf16 activations; a bad label is a ValueError naming ``arg``."""
    specs = [parse_state_label(label, arg) for label in labels]
    return unique(cfg for name in presets for st in specs for cfg in spec_configs(get_preset(name), st, "bf16"))


def stored_gate_configs() -> list[KernelConfig]:
    """The stored-checkpoint modules of GATE_STATES x GATE_PRESETS (bf16 activations)."""
    return label_configs(GATE_PRESETS, GATE_STATES)
