"""TensorRT-LLM plugin module: registers ReplaySSM model subclasses with ``register_auto_model``.

Importing this package does not import TensorRT-LLM. ``register(manifest_path)`` does: it checks the version, then
registers subclasses of ``NemotronHForCausalLM`` and ``Qwen3NextForCausalLM`` / ``Qwen3_5ForCausalLM`` /
``Qwen3_5MoeForCausalLM`` whose SSM mixers take the replay path for non-speculative decode. The bundle's
``trtllm_module/__init__.py`` (loaded by ``trtllm-serve --custom_module_dirs``) calls it.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from trtllm_replayssm.serving.trtllm.core import check_trtllm_version

# The TensorRT-LLM names and signatures the module relies on (package data; build_scripts/extract_trtllm_symbols.py).
SYMBOLS_PATH = Path(__file__).with_name("trtllm_symbols.json")


@dataclass(frozen=True)
class ReplaySettings:
    """What the mixers need from the bundle manifest."""

    buffer_len: int
    act_dtype: str
    family: str


def load_settings(manifest_path: str | Path) -> ReplaySettings:
    """ReplaySettings from a bundle's manifest.json."""
    data = json.loads(Path(manifest_path).read_text())
    try:
        return ReplaySettings(buffer_len=int(data["buffer_len"]), act_dtype=data["dtypes"]["activation"],
                              family=data["plan"]["family"])
    except KeyError as exc:
        raise ValueError(f"manifest_path: {manifest_path} lacks field {exc}") from None


def register(manifest_path: str | Path) -> list[str]:
    """Import TensorRT-LLM, check its version, register the ReplaySSM models; return the architectures registered."""
    try:
        import tensorrt_llm
    except ImportError as exc:
        raise ImportError("trtllm_replayssm.serving.trtllm needs TensorRT-LLM: pip install tensorrt-llm==1.4.0rc1 "
                          f"(NVIDIA PyPI index); import failed: {exc}") from exc
    check_trtllm_version(tensorrt_llm.__version__)
    from trtllm_replayssm.serving.trtllm import integration

    return integration.register_models(load_settings(manifest_path))
