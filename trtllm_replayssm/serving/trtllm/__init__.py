"""TensorRT-LLM plugin module: ReplaySSM model subclasses for ``trtllm-serve --custom_module_dirs``.

Importing this package does not import TensorRT-LLM. ``register(manifest_path)`` (called by the bundle's
``trtllm_module/__init__.py`` in the driver process) checks the installed TensorRT-LLM, publishes the manifest path
to worker processes through ``$TRTLLM_REPLAYSSM_MANIFEST`` (TensorRT-LLM forwards ``TRTLLM*`` variables to its MPI
workers) and imports ``integration``, whose import registers the model classes. A worker that imports
``integration`` to find a class registers them the same way and reads the manifest from the variable.
"""
from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from pathlib import Path

from trtllm_replayssm.core.limits import check_buffer_len
from trtllm_replayssm.serving import signature_check
from trtllm_replayssm.serving.trtllm.core import check_trtllm_version, recorded_symbols

MANIFEST_ENV = "TRTLLM_REPLAYSSM_MANIFEST"
KIMI_MODULES = ("tensorrt_llm._torch.models.modeling_kimi_linear", "tensorrt_llm._torch.modules.kimi_kda.kimi_kda_mixer")


@dataclass(frozen=True)
class ReplaySettings:
    """What the mixers need from the bundle manifest."""

    buffer_len: int
    act_dtype: str
    family: str
    planned_ring_bytes: int  # rings + cursors of every SSM layer for planned_slots slots (the manifest's plan)
    planned_slots: int
    state: str = "fp32"  # the checkpoint spec's label (StateSpec.label): plain, or a master in the pool + our state
    spec_tokens: int | None = None  # MTP draft tokens the rings were sized for (build --spec-tokens)


def load_settings(manifest_path: str | Path) -> ReplaySettings:
    """ReplaySettings from a bundle's manifest.json."""
    path = Path(manifest_path)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"manifest_path: cannot read a bundle manifest at {path}: {exc}") from None
    try:
        return ReplaySettings(buffer_len=check_buffer_len(data["buffer_len"]), act_dtype=data["dtypes"]["activation"],
                              family=data["plan"]["family"],
                              planned_ring_bytes=int(data["memory"]["ring_bytes_per_gpu"]),
                              planned_slots=int(data["memory"]["max_batch_size"]) + 1, state=data["state"]["label"],
                              spec_tokens=data.get("spec_tokens"))
    except KeyError as exc:
        raise ValueError(f"manifest_path: {path} lacks field {exc}") from None


def settings_from_env() -> ReplaySettings:
    """The settings of the manifest ``register`` published in ``$TRTLLM_REPLAYSSM_MANIFEST``."""
    path = os.environ.get(MANIFEST_ENV)
    if not path:
        raise RuntimeError(f"trtllm-replayssm: ${MANIFEST_ENV} is not set: load the module through the bundle's "
                           "trtllm_module (trtllm-serve --custom_module_dirs <bundle>/trtllm_module)")
    return load_settings(path)


@functools.lru_cache(maxsize=None)
def check_installed_trtllm(version: str, skip_kimi: bool) -> None:
    """Version gate, then every recorded signature against the installed one (once per process and version)."""
    check_trtllm_version(version)
    recorded = signature_check.recorded_signatures(recorded_symbols())
    if skip_kimi:
        recorded = {name: sig for name, sig in recorded.items() if name.partition(":")[0] not in KIMI_MODULES}
    signature_check.check_signatures(recorded, signature_check.resolve_all(recorded), version)


def register(manifest_path: str | Path) -> list[str]:
    """Check the manifest and TensorRT-LLM, register the ReplaySSM models; return the architectures registered."""
    manifest_path = Path(manifest_path).resolve()
    load_settings(manifest_path)
    try:
        import tensorrt_llm
    except ImportError as exc:
        raise ImportError("trtllm_replayssm.serving.trtllm needs TensorRT-LLM: pip install tensorrt-llm==1.4.0rc1 "
                          f"(NVIDIA PyPI index); import failed: {exc}") from exc
    check_trtllm_version(tensorrt_llm.__version__)  # before the import, which needs this version's names
    os.environ[MANIFEST_ENV] = str(manifest_path)
    from trtllm_replayssm.serving.trtllm import integration

    check_installed_trtllm(tensorrt_llm.__version__, skip_kimi=integration.KimiKDALinearAttention is None)
    return list(integration.MODELS)
