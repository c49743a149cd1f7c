"""Read a local Hugging Face ``config.json`` into a ``ModelSpec`` (layer plan + SSM geometry).

Supported architectures: Nemotron-H (Mamba-2), Qwen3-Next / Qwen3.5 (Gated DeltaNet; ``text_config`` nesting of the
multimodal releases included) and Kimi-Linear (KDA). The SSM inner size is always heads x head_dim: some configs'
``expand`` disagrees with it.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.formats import dtype_name
from trtllm_replayssm.serving.presets import AttentionDims, ModelSpec, interleaved_layers, nemotron_layers



class ConfigError(ValueError):
    """A config.json that cannot be turned into a ModelSpec (unknown architecture, missing or bad field)."""


class _Fields:
    """Field access on a config dict that raises ConfigError naming the architecture and the field."""

    def __init__(self, cfg: dict[str, Any], arch: str):
        self.cfg, self.arch = cfg, arch

    def req(self, key: str) -> Any:
        if self.cfg.get(key) is None:
            raise ConfigError(f"config.json ({self.arch}): missing field {key!r}")
        return self.cfg[key]

    def int(self, key: str) -> int:
        value = self.req(key)
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"config.json ({self.arch}): field {key!r} must be a positive integer, got {value!r}")
        return value

    def opt(self, key: str, default: Any = None) -> Any:
        value = self.cfg.get(key)
        return default if value is None else value


def _state_dtype(f: _Fields, *keys: str) -> str:
    for key in keys:
        value = f.opt(key)
        if isinstance(value, str):
            try:
                return dtype_name(value)
            except ValueError:
                continue
    return "fp32"


def _nemotron_h(cfg: dict[str, Any], arch: str, name: str) -> ModelSpec:
    f = _Fields(cfg, arch)
    pattern = f.req("hybrid_override_pattern")
    try:
        layers = nemotron_layers(pattern)
    except ValueError as exc:
        raise ConfigError(f"config.json ({arch}): {exc}") from None
    heads = f.int("num_attention_heads")
    hidden = f.int("hidden_size")
    inter = f.opt("intermediate_size")
    return ModelSpec(
        name=name, architecture=arch, family="mamba2", hidden_size=hidden, vocab_size=f.int("vocab_size"),
        layers=layers,
        attention=AttentionDims(num_heads=heads, num_kv_heads=f.int("num_key_value_heads"),
                                head_dim=f.opt("head_dim", hidden // heads),
                                sliding_window=f.opt("sliding_window") or 0),
        intermediate_size=inter[0] if isinstance(inter, list) else inter,
        moe_intermediate_size=f.opt("moe_intermediate_size"), num_experts=f.opt("n_routed_experts"),
        experts_per_token=f.opt("num_experts_per_tok"),
        mamba2=Mamba2Dims(nheads=f.int("mamba_num_heads"), head_dim=f.int("mamba_head_dim"),
                          d_state=f.int("ssm_state_size"), n_groups=f.int("n_groups"),
                          conv_kernel=f.opt("conv_kernel", 4), chunk_size=f.opt("chunk_size", 128)),
        ssm_state_dtype=_state_dtype(f, "mamba_ssm_cache_dtype"), source="config.json",
    )


def _qwen_gdn(cfg: dict[str, Any], arch: str, name: str) -> ModelSpec:
    f = _Fields(cfg, arch)
    n = f.int("num_hidden_layers")
    layer_types = f.opt("layer_types")
    if layer_types is not None:
        if len(layer_types) != n:
            raise ConfigError(f"config.json ({arch}): layer_types has {len(layer_types)} entries, "
                              f"num_hidden_layers is {n}")
        attn = {i for i, t in enumerate(layer_types) if t == "full_attention"}
    else:
        interval = f.int("full_attention_interval")
        attn = {i for i in range(n) if (i + 1) % interval == 0}
    num_experts = f.opt("num_experts", 0)
    mlp_only = set(f.opt("mlp_only_layers", []))
    step = f.opt("decoder_sparse_step", 1)
    moe = {i for i in range(n) if num_experts and i not in mlp_only and (i + 1) % step == 0}
    heads = f.int("num_attention_heads")
    return ModelSpec(
        name=name, architecture=arch, family="gdn", hidden_size=f.int("hidden_size"), vocab_size=f.int("vocab_size"),
        layers=interleaved_layers(n, "gdn", attn, moe),
        attention=AttentionDims(num_heads=heads, num_kv_heads=f.int("num_key_value_heads"),
                                head_dim=f.opt("head_dim", f.int("hidden_size") // heads),
                                sliding_window=f.opt("sliding_window") or 0),
        intermediate_size=f.opt("intermediate_size"), moe_intermediate_size=f.opt("moe_intermediate_size"),
        num_experts=num_experts or None, experts_per_token=f.opt("num_experts_per_tok"),
        gdn=GDNDims(num_k_heads=f.int("linear_num_key_heads"), num_v_heads=f.int("linear_num_value_heads"),
                    head_k_dim=f.int("linear_key_head_dim"), head_v_dim=f.int("linear_value_head_dim"),
                    conv_kernel=f.opt("linear_conv_kernel_dim", 4)),
        ssm_state_dtype=_state_dtype(f, "mamba_ssm_dtype"), source="config.json",
    )


def _kimi_linear(cfg: dict[str, Any], arch: str, name: str) -> ModelSpec:
    f = _Fields(cfg, arch)
    n = f.int("num_hidden_layers")
    lac = _Fields(f.req("linear_attn_config"), f"{arch} linear_attn_config")
    full = lac.opt("full_attn_layers")
    if full is None:  # only kda_layers given (1-based)
        kda = set(lac.req("kda_layers"))
        full = [i for i in range(1, n + 1) if i not in kda]
    attn = {i - 1 for i in full}  # published lists are 1-based
    first_dense = f.opt("first_k_dense_replace", 0)
    num_experts = f.opt("num_experts", 0)
    moe = {i for i in range(first_dense, n)} if num_experts else set()
    return ModelSpec(
        name=name, architecture=arch, family="kda", hidden_size=f.int("hidden_size"), vocab_size=f.int("vocab_size"),
        layers=interleaved_layers(n, "kda", attn, moe),
        attention=AttentionDims(num_heads=f.int("num_attention_heads"),
                                num_kv_heads=f.opt("num_key_value_heads", f.int("num_attention_heads")),
                                head_dim=f.opt("v_head_dim", 128), kind="mla", kv_lora_rank=f.opt("kv_lora_rank"),
                                qk_rope_head_dim=f.opt("qk_rope_head_dim", 0)),
        intermediate_size=f.opt("intermediate_size"), moe_intermediate_size=f.opt("moe_intermediate_size"),
        num_experts=num_experts or None,
        experts_per_token=f.opt("num_experts_per_token", f.opt("num_experts_per_tok")),
        kda=KDADims(num_heads=lac.int("num_heads"), head_dim=lac.int("head_dim"),
                    conv_kernel=lac.opt("short_conv_kernel_size", 4), gate_lower_bound=lac.opt("gate_lower_bound")),
        source="config.json",
    )


_PARSERS: dict[str, Callable[[dict[str, Any], str, str], ModelSpec]] = {
    "NemotronHForCausalLM": _nemotron_h,
    "Qwen3NextForCausalLM": _qwen_gdn,
    "Qwen3_5ForCausalLM": _qwen_gdn,
    "Qwen3_5MoeForCausalLM": _qwen_gdn,
    "Qwen3_5ForConditionalGeneration": _qwen_gdn,
    "Qwen3_5MoeForConditionalGeneration": _qwen_gdn,
    "KimiLinearForCausalLM": _kimi_linear,
}
SUPPORTED_ARCHITECTURES: tuple[str, ...] = tuple(_PARSERS)


def spec_from_config(cfg: dict[str, Any], name: str = "model") -> ModelSpec:
    """ModelSpec of a parsed config.json dict (``text_config`` is merged over the top level when present)."""
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not archs:
        raise ConfigError(f"config.json: missing field 'architectures'; supported: {list(SUPPORTED_ARCHITECTURES)}")
    arch = archs[0]
    if arch not in _PARSERS:
        raise ConfigError(f"config.json: unsupported architecture {arch!r}; supported: {list(SUPPORTED_ARCHITECTURES)}")
    text = cfg.get("text_config")
    merged = {**cfg, **text} if isinstance(text, dict) else cfg
    return _PARSERS[arch](merged, arch, name)


def load_config_dir(model_dir: str | Path) -> ModelSpec:
    """ModelSpec of a local model directory holding config.json."""
    path = Path(model_dir)
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise ConfigError(f"model: {str(path)!r} has no config.json")
    try:
        cfg = json.loads(cfg_path.read_text())
    except json.JSONDecodeError as exc:
        raise ConfigError(f"model: {str(cfg_path)!r} is not valid JSON ({exc})") from None
    if not isinstance(cfg, dict):
        raise ConfigError(f"model: {str(cfg_path)!r} must hold a JSON object, got {type(cfg).__name__}")
    return spec_from_config(cfg, name=path.resolve().name)


def resolve_model(model: str) -> ModelSpec:
    """A preset name or a local model directory -> ModelSpec."""
    from trtllm_replayssm.serving.presets import PRESETS, get_preset

    if model.strip().lower() in PRESETS:
        return get_preset(model)
    if Path(model).is_dir():
        return load_config_dir(model)
    raise ConfigError(f"model: {model!r} is neither a preset ({list(PRESETS)}) nor a local directory")
