"""Geometry of the reference hybrid decoders, built from a preset, a Hugging Face config dict, or by hand."""
from __future__ import annotations

import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from trtllm_replayssm.core.dims import GDNDims, Mamba2Dims

ARCHS: tuple[str, ...] = ("nemotron_h", "qwen3_5")
# Nemotron-H: every layer is one block (mixer only); Qwen3.5: every layer is a mixer plus an FFN.
NEMOTRON_KINDS: tuple[str, ...] = ("mamba2", "attention", "mlp", "moe")
QWEN_KINDS: tuple[str, ...] = ("gdn", "attention")


@dataclass(frozen=True)
class HybridConfig:
    """Dims of a reference hybrid decoder. ``layer_kinds`` is the (possibly sliced) layer pattern.

    MoE layers run as one dense expert whose width is the per-token routed width (``moe_top_k * moe_intermediate``)
    plus the shared expert, optionally inside a latent projection (``moe_latent_size``): same per-token FLOPs, not the
    same weight traffic. ``layer_offset``/``total_layers`` describe a slice of a larger model.
    """

    arch: str
    name: str
    vocab_size: int
    hidden_size: int
    layer_kinds: tuple[str, ...]
    rms_eps: float = 1e-5
    # Mamba-2 (nemotron_h)
    mamba_heads: int = 0
    mamba_head_dim: int = 0
    d_state: int = 0
    n_groups: int = 1
    # Gated DeltaNet (qwen3_5)
    gdn_k_heads: int = 0
    gdn_v_heads: int = 0
    gdn_k_dim: int = 0
    gdn_v_dim: int = 0
    conv_kernel: int = 4
    # attention
    attn_heads: int = 1
    kv_heads: int = 1
    attn_head_dim: int = 1
    rotary_dim: int = 0
    rope_theta: float = 10000.0
    attn_window: int = 0  # tokens a query attends to, itself included (0: every earlier token)
    # FFN
    intermediate_size: int = 0
    moe_intermediate: int = 0
    moe_top_k: int = 0
    moe_shared: int = 0
    moe_latent_size: int = 0
    tie_word_embeddings: bool = False
    layer_offset: int = 0
    total_layers: int = 0
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.arch not in ARCHS:
            raise ValueError(f"arch: expected one of {ARCHS}, got {self.arch!r}")
        allowed = NEMOTRON_KINDS if self.arch == "nemotron_h" else QWEN_KINDS
        bad = sorted({k for k in self.layer_kinds if k not in allowed})
        if bad or not self.layer_kinds:
            raise ValueError(f"layer_kinds: expected a non-empty sequence of {allowed} for {self.arch}, "
                             f"got {bad or '()'}")
        if self.total_layers == 0:
            object.__setattr__(self, "total_layers", len(self.layer_kinds))
        ssm = "mamba2" if self.arch == "nemotron_h" else "gdn"
        if ssm in self.layer_kinds:
            dims = ((self.mamba_heads, self.mamba_head_dim, self.d_state, self.n_groups) if ssm == "mamba2"
                    else (self.gdn_k_heads, self.gdn_v_heads, self.gdn_k_dim, self.gdn_v_dim))
            if min(dims) <= 0:
                raise ValueError(f"{ssm} dims: expected positive sizes, got {dims}")
            if ssm == "mamba2" and self.mamba_heads % self.n_groups:
                raise ValueError(f"n_groups: expected a divisor of mamba_heads={self.mamba_heads}, got {self.n_groups}")
            if ssm == "gdn" and self.gdn_v_heads % self.gdn_k_heads:
                raise ValueError(f"gdn_k_heads: expected a divisor of gdn_v_heads={self.gdn_v_heads}, "
                                 f"got {self.gdn_k_heads}")
        if "attention" in self.layer_kinds and self.attn_heads % self.kv_heads:
            raise ValueError(f"kv_heads: expected a divisor of attn_heads={self.attn_heads}, got {self.kv_heads}")
        if self.attn_window < 0:
            raise ValueError(f"attn_window: expected >= 0 (0: full attention), got {self.attn_window}")
        if self.rotary_dim % 2 or self.rotary_dim > self.attn_head_dim:
            raise ValueError(f"rotary_dim: expected an even number <= attn_head_dim={self.attn_head_dim}, "
                             f"got {self.rotary_dim}")

    # ------------------------------------------------------------------ derived sizes
    @property
    def ssm_kind(self) -> str:
        return "mamba2" if self.arch == "nemotron_h" else "gdn"

    @property
    def ssm_layers(self) -> list[int]:
        return [i for i, k in enumerate(self.layer_kinds) if k == self.ssm_kind]

    @property
    def ssm_dims(self) -> Mamba2Dims | GDNDims:
        """The SSM layers' dims (core/dims.py)."""
        if self.arch == "nemotron_h":
            return Mamba2Dims(nheads=self.mamba_heads, head_dim=self.mamba_head_dim, d_state=self.d_state,
                              n_groups=self.n_groups, conv_kernel=self.conv_kernel)
        return GDNDims(num_k_heads=self.gdn_k_heads, num_v_heads=self.gdn_v_heads, head_k_dim=self.gdn_k_dim,
                       head_v_dim=self.gdn_v_dim, conv_kernel=self.conv_kernel)

    @property
    def d_inner(self) -> int:
        return self.mamba_heads * self.mamba_head_dim

    @property
    def has_moe(self) -> bool:
        return "moe" in self.layer_kinds or (self.arch == "qwen3_5" and self.moe_top_k > 0)

    @property
    def moe_dense_width(self) -> int:
        return self.moe_top_k * self.moe_intermediate

    @property
    def layers_label(self) -> str:
        """``"all"`` for a whole model, ``"a-b of N"`` (inclusive, 0-based) for a slice."""
        n = len(self.layer_kinds)
        if n == self.total_layers and self.layer_offset == 0:
            return "all"
        return f"{self.layer_offset}-{self.layer_offset + n - 1} of {self.total_layers}"

    def describe(self) -> list[str]:
        """Human-readable notes on what the reference decoder runs (slice, MoE substitution, notes)."""
        out = list(self.notes)
        if self.layers_label != "all":
            out.append(f"runs a contiguous slice of {len(self.layer_kinds)} layers ({self.layers_label}) "
                       "with the real layer pattern")
        if self.has_moe:
            latent = f" inside a {self.moe_latent_size}-wide latent projection" if self.moe_latent_size else ""
            shared = f" + shared {self.moe_shared}" if self.moe_shared else ""
            out.append(f"MoE layers run as one dense expert of the per-token routed width "
                       f"{self.moe_top_k}x{self.moe_intermediate}{shared}{latent} (real routing reads more expert "
                       "weights per step)")
        return out

    def slice(self, k: int, start: int = 0) -> "HybridConfig":
        """A contiguous slice of ``k`` layers starting at ``start``, keeping the real layer pattern."""
        n = len(self.layer_kinds)
        if not 1 <= k <= n:
            raise ValueError(f"gpu_layers: expected 1 <= K <= {n}, got {k}")
        if not 0 <= start <= n - k:
            raise ValueError(f"start: expected 0 <= start <= {n - k}, got {start}")
        return replace(self, layer_kinds=self.layer_kinds[start:start + k], layer_offset=self.layer_offset + start,
                       total_layers=self.total_layers)


# ---------------------------------------------------------------------- builders
def from_spec(spec: Any, **extra: Any) -> HybridConfig:
    """Decoder config of a :class:`~trtllm_replayssm.serving.presets.ModelSpec` (a preset or a parsed config.json); ``extra``
    overrides decoder-only fields (norm eps, RoPE, tied embeddings, shared/latent MoE sizes)."""
    att = spec.attention
    kinds = tuple(lp.kind for lp in spec.layers)
    common: dict[str, Any] = dict(
        name=spec.name, vocab_size=spec.vocab_size, hidden_size=spec.hidden_size, layer_kinds=kinds,
        attn_heads=att.num_heads, kv_heads=att.num_kv_heads, attn_head_dim=att.head_dim,
        attn_window=att.sliding_window, intermediate_size=spec.intermediate_size or 0, moe_intermediate=spec.moe_intermediate_size or 0,
        moe_top_k=spec.experts_per_token or 0, notes=tuple(spec.notes),
    )
    if spec.family == "mamba2":
        m = spec.mamba2
        common.update(arch="nemotron_h", mamba_heads=m.nheads, mamba_head_dim=m.head_dim, d_state=m.d_state,
                      n_groups=m.n_groups, conv_kernel=m.conv_kernel)
    elif spec.family == "gdn":
        g = spec.gdn
        ffn = {lp.ffn for lp in spec.layers}
        if ffn == {"mlp", "moe"}:
            raise ValueError(f"model: {spec.name!r} mixes dense and MoE layers; the reference decoder needs all "
                             "or none")
        if ffn != {"moe"}:
            common["moe_top_k"] = 0
        common.update(arch="qwen3_5", rms_eps=1e-6, gdn_k_heads=g.num_k_heads, gdn_v_heads=g.num_v_heads,
                      gdn_k_dim=g.head_k_dim, gdn_v_dim=g.head_v_dim, conv_kernel=g.conv_kernel,
                      rotary_dim=int(att.head_dim * 0.25) // 2 * 2, rope_theta=1.0e7)
    else:
        raise ValueError(f"model: {spec.name!r} is of family {spec.family!r}; the reference decoders cover "
                         "'mamba2' (Nemotron-H) and 'gdn' (Qwen3.5)")
    common.update(extra)
    return HybridConfig(**common)


def from_preset(name: str) -> HybridConfig:
    """Config of a built-in preset (``trtllm_replayssm.serving.presets``); only Mamba-2 and GDN presets have a decoder."""
    from trtllm_replayssm.serving.presets import get_preset

    return from_spec(get_preset(name))


def from_hf_config(cfg: dict[str, Any], name: str = "model") -> HybridConfig:
    """Parse a NemotronH or Qwen3.5 ``config.json`` dict (layer plan and SSM dims via
    :func:`trtllm_replayssm.serving.hf_config.spec_from_config`, decoder fields read here)."""
    from trtllm_replayssm.serving.hf_config import spec_from_config

    spec = spec_from_config(cfg, name=name)
    text = {**cfg, **cfg["text_config"]} if isinstance(cfg.get("text_config"), dict) else cfg
    extra: dict[str, Any] = {"tie_word_embeddings": bool(text.get("tie_word_embeddings", False))}
    if spec.family == "mamba2":
        extra["rms_eps"] = float(text.get("layer_norm_epsilon", text.get("rms_norm_eps", 1e-5)))
        extra["moe_shared"] = int(text.get("moe_shared_expert_intermediate_size") or 0)
        extra["moe_latent_size"] = int(text.get("moe_latent_size") or 0)
    elif spec.family == "gdn":
        rope = text.get("rope_parameters") or text.get("rope_scaling") or {}
        partial = float(text.get("partial_rotary_factor", rope.get("partial_rotary_factor", 0.25)))
        extra["rms_eps"] = float(text.get("rms_norm_eps", 1e-6))
        extra["rotary_dim"] = int(spec.attention.head_dim * partial) // 2 * 2
        extra["rope_theta"] = float(text.get("rope_theta", rope.get("rope_theta", 1.0e7)))
        extra["moe_shared"] = int(text.get("shared_expert_intermediate_size") or 0) if spec.num_experts else 0
    return from_spec(spec, **extra)


_NEMOTRON_CHARS = {"mamba2": "M", "attention": "*", "mlp": "-"}


def to_hf_config(cfg: HybridConfig) -> dict[str, Any]:
    """The ``config.json`` dict of a dense decoder config (NemotronH or Qwen3.5 text), which :func:`from_hf_config`
    parses back to ``cfg`` (a trained model's directory holds it beside its safetensors)."""
    if cfg.has_moe or cfg.layer_offset or (cfg.total_layers and cfg.total_layers != len(cfg.layer_kinds)):
        raise ValueError(f"cfg: {cfg.name!r} is a MoE model or a layer slice; only whole dense models are written")
    common = {"hidden_size": cfg.hidden_size, "vocab_size": cfg.vocab_size, "num_hidden_layers": len(cfg.layer_kinds),
              "num_attention_heads": cfg.attn_heads, "num_key_value_heads": cfg.kv_heads,
              "head_dim": cfg.attn_head_dim, "intermediate_size": cfg.intermediate_size,
              "tie_word_embeddings": cfg.tie_word_embeddings, "torch_dtype": "float32",
              "sliding_window": cfg.attn_window or None}
    if cfg.arch == "nemotron_h":
        return {"architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h", **common,
                "hybrid_override_pattern": "".join(_NEMOTRON_CHARS[k] for k in cfg.layer_kinds),
                "mamba_num_heads": cfg.mamba_heads, "mamba_head_dim": cfg.mamba_head_dim,
                "ssm_state_size": cfg.d_state, "n_groups": cfg.n_groups, "conv_kernel": cfg.conv_kernel,
                "layer_norm_epsilon": cfg.rms_eps}
    return {"architectures": ["Qwen3_5ForCausalLM"], "model_type": "qwen3_5_text", **common,
            "layer_types": ["full_attention" if k == "attention" else "linear_attention" for k in cfg.layer_kinds],
            "linear_num_key_heads": cfg.gdn_k_heads, "linear_num_value_heads": cfg.gdn_v_heads,
            "linear_key_head_dim": cfg.gdn_k_dim, "linear_value_head_dim": cfg.gdn_v_dim,
            "linear_conv_kernel_dim": cfg.conv_kernel, "rms_norm_eps": cfg.rms_eps,
            "partial_rotary_factor": cfg.rotary_dim / cfg.attn_head_dim, "rope_theta": cfg.rope_theta}


def load_hf_config(path: str | Path) -> HybridConfig:
    """Read ``config.json`` (a file or a model directory) and parse it."""
    p = Path(path)
    file = p / "config.json" if p.is_dir() else p
    if not file.is_file():
        raise ValueError(f"model: expected a preset name, a config.json or a model directory, got {str(path)!r}")
    return from_hf_config(json.loads(file.read_text()), name=p.name if p.is_dir() else p.parent.name)
