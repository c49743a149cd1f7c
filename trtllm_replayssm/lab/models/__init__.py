"""Reference hybrid decoders (Nemotron-H with Mamba-2, Qwen3.5 with Gated DeltaNet) for ``trtllm-replayssm compare``."""
from __future__ import annotations

from .config import HybridConfig, from_hf_config, from_preset, load_hf_config
from .decoder import DecodeState, HybridLM
from .runner import DecodeRun, acceptance_pattern, greedy_decode, speculative_decode, time_ssm_only
from .ssm_state import SSM_IMPLS, SSMStates
from .weights import from_pretrained, load_safetensors_

__all__ = [
    "HybridConfig", "from_hf_config", "from_preset", "load_hf_config", "DecodeState", "HybridLM", "DecodeRun",
    "greedy_decode", "speculative_decode", "acceptance_pattern", "time_ssm_only", "SSM_IMPLS", "SSMStates",
    "from_pretrained", "load_safetensors_",
]
