"""trtllm-replayssm: ReplaySSM decode kernels (checkpoint + input ring) for hybrid LLMs in TensorRT-LLM."""
from __future__ import annotations

__version__ = "0.1.0"
