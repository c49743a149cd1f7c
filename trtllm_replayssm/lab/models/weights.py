"""Load real ``safetensors`` weights (Hugging Face NemotronH / Qwen3.5 parameter names) into a :class:`HybridLM`."""
from __future__ import annotations

import re
from pathlib import Path

import torch

from .config import HybridConfig, load_hf_config
from .decoder import HybridLM

# checkpoint prefixes mapped onto the decoder's names (Qwen3.5 releases nest the text model in a VL wrapper)
_PREFIX_MAP: tuple[tuple[str, str], ...] = (("model.language_model.", "model."),)
# checkpoint parts the text decoder does not use
_SKIP = re.compile(r"^(model\.visual\.|visual\.|mtp\.|model\.mtp\.)")
_LAYER = re.compile(r"^(backbone|model)\.layers\.(\d+)\.(.*)$")


def _map_name(name: str, cfg: HybridConfig) -> str | None:
    """Decoder name for a checkpoint name; None for tensors outside the decoder or outside the layer slice."""
    for old, new in _PREFIX_MAP:
        if name.startswith(old):
            name = new + name[len(old):]
    if _SKIP.match(name):
        return None
    m = _LAYER.match(name)
    if m:
        j = int(m.group(2)) - cfg.layer_offset
        if not 0 <= j < len(cfg.layer_kinds):
            return None
        return f"{m.group(1)}.layers.{j}.{m.group(3)}"
    return name


def load_safetensors_(model: HybridLM, model_dir: str | Path) -> list[str]:
    """Copy every ``*.safetensors`` tensor of ``model_dir`` into ``model`` by name (casting dtypes, slice-aware).

    Raises ValueError on a shape mismatch, on tensors the decoder does not have (e.g. routed MoE experts, which the
    reference decoder runs as one dense expert), or on decoder parameters missing from the checkpoint. Returns the
    files read."""
    from safetensors import safe_open

    files = sorted(Path(model_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"model_dir: expected *.safetensors files in {str(model_dir)!r}, found none")
    if model.cfg.has_moe:
        raise ValueError("model_dir: MoE checkpoints are not loadable: the reference decoder runs MoE layers as one "
                         "dense expert; use random weights (a preset or config.json) for MoE models")
    params = dict(model.named_parameters())
    loaded: set[str] = set()
    unexpected: list[str] = []
    with torch.no_grad():
        for f in files:
            with safe_open(str(f), framework="pt") as sf:
                for key in sf.keys():
                    name = _map_name(key, model.cfg)
                    if name is None:
                        continue
                    if name not in params:
                        unexpected.append(key)
                        continue
                    t = sf.get_tensor(key)
                    p = params[name]
                    if tuple(t.shape) != tuple(p.shape):
                        raise ValueError(f"{key}: expected shape {tuple(p.shape)}, got {tuple(t.shape)}")
                    p.copy_(t.to(device=p.device, dtype=p.dtype))
                    loaded.add(name)
    if unexpected:
        raise ValueError(f"model_dir: {len(unexpected)} checkpoint tensors have no place in the decoder, "
                         f"e.g. {unexpected[:5]}")
    missing = sorted(set(params) - loaded)
    if missing == ["lm_head.weight"] and model.cfg.tie_word_embeddings:
        emb = "backbone.embeddings.weight" if model.cfg.arch == "nemotron_h" else "model.embed_tokens.weight"
        with torch.no_grad():
            params["lm_head.weight"].copy_(params[emb])
        missing = []
    if missing:
        raise ValueError(f"model_dir: {len(missing)} decoder parameters are missing from the checkpoint, "
                         f"e.g. {missing[:5]}")
    return [str(f) for f in files]


def from_pretrained(model_dir: str | Path, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu",
                    gpu_layers: int | None = None) -> HybridLM:
    """A decoder with the config and weights of ``model_dir`` (``config.json`` + ``*.safetensors``); with
    ``gpu_layers`` only the first ``gpu_layers`` layers are built and loaded."""
    cfg = load_hf_config(model_dir)
    if gpu_layers is not None:
        cfg = cfg.slice(gpu_layers)
    with torch.device("meta"):
        model = HybridLM(cfg)
    model.to_empty(device=torch.device(device))
    model.cast_(dtype)
    load_safetensors_(model, model_dir)
    return model
