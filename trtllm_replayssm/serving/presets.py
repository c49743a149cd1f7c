"""Model presets: the layer plan and SSM geometry of the hybrid models trtllm-replayssm targets.

API used by the benchmark, ``compare`` and ``build``:

* ``get_preset(name) -> ModelSpec`` and ``list_presets() -> list[str]``;
* ``spec.family`` ("mamba2" | "gdn" | "kda"), ``spec.ssm_layers`` (indices of recurrent layers),
  ``spec.mamba2`` / ``spec.gdn`` / ``spec.kda`` (the dims of the model's family; the other two are None),
  ``spec.ssm_dims`` (whichever of the three is set), ``spec.attention``, ``spec.layers`` (one ``LayerPlan`` each).

Shapes are the published ones; ``ModelSpec.source`` names where each comes from.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims, SSMDims

FAMILIES: tuple[str, ...] = ("mamba2", "gdn", "kda")
LAYER_KINDS: tuple[str, ...] = (*FAMILIES, "attention", "mlp", "moe")


@dataclass(frozen=True)
class AttentionDims:
    """Attention layers: GQA (``kind="gqa"``) or MLA (``kind="mla"``, with the latent KV sizes); ``sliding_window``:
    tokens a query attends to (itself included; 0: every earlier token)."""

    num_heads: int
    num_kv_heads: int
    head_dim: int
    kind: str = "gqa"
    kv_lora_rank: int | None = None
    qk_rope_head_dim: int | None = None
    sliding_window: int = 0

    def kv_elems_per_token(self) -> int:
        """KV-cache elements per token per attention layer (per-rank split not applied)."""
        if self.kind == "mla":
            return (self.kv_lora_rank or 0) + (self.qk_rope_head_dim or 0)
        return 2 * self.num_kv_heads * self.head_dim


@dataclass(frozen=True)
class LayerPlan:
    """One decoder layer: ``kind`` is the mixer or block (mamba2/gdn/kda/attention/mlp/moe); ``ffn`` the MLP part
    of a layer that has one (Qwen/Kimi/GLM layers: "mlp" or "moe"; Nemotron-H blocks: None)."""

    index: int
    kind: str
    ffn: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in LAYER_KINDS:
            raise ValueError(f"LayerPlan.kind: expected one of {LAYER_KINDS}, got {self.kind!r}")
        if self.ffn not in (None, "mlp", "moe"):
            raise ValueError(f"LayerPlan.ffn: expected None, 'mlp' or 'moe', got {self.ffn!r}")


@dataclass(frozen=True)
class ModelSpec:
    """A hybrid model: layer plan, SSM dims of its family, attention and FFN sizes."""

    name: str
    architecture: str
    family: str
    hidden_size: int
    vocab_size: int
    layers: tuple[LayerPlan, ...]
    attention: AttentionDims
    intermediate_size: int | None = None
    moe_intermediate_size: int | None = None
    num_experts: int | None = None
    experts_per_token: int | None = None
    mamba2: Mamba2Dims | None = None
    gdn: GDNDims | None = None
    kda: KDADims | None = None
    ssm_state_dtype: str = "fp32"
    act_dtype: str = "bf16"
    source: str = ""
    notes: tuple[str, ...] = field(default=())

    def __post_init__(self) -> None:
        if self.family not in FAMILIES:
            raise ValueError(f"ModelSpec.family: expected one of {FAMILIES}, got {self.family!r}")
        if getattr(self, self.family) is None:
            raise ValueError(f"ModelSpec {self.name!r}: family {self.family!r} needs its dims ({self.family}=...)")
        wrong = [lp.index for lp in self.layers if lp.kind in FAMILIES and lp.kind != self.family]
        if wrong:
            raise ValueError(f"ModelSpec {self.name!r}: layers {wrong} are not of family {self.family!r}")

    @property
    def ssm_dims(self) -> SSMDims:
        return getattr(self, self.family)

    @property
    def ssm_layers(self) -> list[int]:
        return [lp.index for lp in self.layers if lp.kind == self.family]

    @property
    def attention_layers(self) -> list[int]:
        return [lp.index for lp in self.layers if lp.kind == "attention"]

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def tp_divisors(self) -> dict[str, int]:
        """Every head/group count that a TP size must divide (SSM and attention)."""
        out = dict(self.ssm_dims.tp_divisors())
        if self.attention_layers:
            out["num_attention_heads"] = self.attention.num_heads
            if self.attention.kind == "gqa":
                out["num_key_value_heads"] = self.attention.num_kv_heads
        return out


def nemotron_layers(pattern: str) -> tuple[LayerPlan, ...]:
    """Layer plan from a Nemotron-H ``hybrid_override_pattern`` (M Mamba-2, * attention, - MLP, E MoE)."""
    kinds = {"M": "mamba2", "*": "attention", "-": "mlp", "E": "moe"}
    bad = sorted({c for c in pattern if c not in kinds})
    if bad or not pattern:
        raise ValueError(f"hybrid_override_pattern: expected a non-empty string of M * - E, got {pattern!r}")
    return tuple(LayerPlan(i, kinds[c]) for i, c in enumerate(pattern))


def interleaved_layers(num_layers: int, family: str, attention_layers: set[int],
                       moe_layers: set[int] | None = None) -> tuple[LayerPlan, ...]:
    """Layer plan of models whose every layer has a mixer (``family`` or attention) plus an FFN."""
    moe_layers = moe_layers or set()
    return tuple(LayerPlan(i, "attention" if i in attention_layers else family, "moe" if i in moe_layers else "mlp")
                 for i in range(num_layers))


_NANO4B_PATTERN = "M-M-M-MM-M-M*-M-M*-M-M-M*-M-M-MM*-MMM-M-M-"
_SUPER_PATTERN = ("MEMEMEM*EMEMEMEM*EMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEMEM*EMEMEMEM*EMEMEMEME")


def _build_presets() -> dict[str, ModelSpec]:
    every4 = lambda n: {i for i in range(n) if i % 4 == 3}  # noqa: E731  (full_attention_interval = 4)
    presets = [
        ModelSpec(
            name="nemotron-3-nano-4b", architecture="NemotronHForCausalLM", family="mamba2",
            hidden_size=3136, vocab_size=131072, layers=nemotron_layers(_NANO4B_PATTERN),
            attention=AttentionDims(num_heads=40, num_kv_heads=8, head_dim=128), intermediate_size=12544,
            mamba2=Mamba2Dims(nheads=96, head_dim=80, d_state=128, n_groups=8, conv_kernel=4, chunk_size=128),
            source="Megatron-Bridge recipe nemotron_3_nano_4b [S]; chunk_size 128 [I]",
        ),
        ModelSpec(
            name="nemotron-3-super-120b", architecture="NemotronHForCausalLM", family="mamba2",
            hidden_size=4096, vocab_size=131072, layers=nemotron_layers(_SUPER_PATTERN),
            attention=AttentionDims(num_heads=32, num_kv_heads=2, head_dim=128),
            moe_intermediate_size=2688, num_experts=512, experts_per_token=22,
            mamba2=Mamba2Dims(nheads=128, head_dim=64, d_state=128, n_groups=8, conv_kernel=4, chunk_size=128),
            source="nvidia/NVIDIA-Nemotron-3-Super-120B-A12B-NVFP4 config.json @4f0cf9da [S]",
            notes=("LatentMoE (latent 1024); MTP pattern '*E'",),
        ),
        ModelSpec(
            name="qwen3.5-4b", architecture="Qwen3_5ForCausalLM", family="gdn",
            hidden_size=2560, vocab_size=248320, layers=interleaved_layers(32, "gdn", every4(32)),
            attention=AttentionDims(num_heads=16, num_kv_heads=4, head_dim=256), intermediate_size=9216,
            gdn=GDNDims(num_k_heads=16, num_v_heads=32, head_k_dim=128, head_v_dim=128, conv_kernel=4),
            source="derivative configs + spec sites [S2]",
            notes=("published checkpoint is multimodal (text_config nesting); served as the text architecture",),
        ),
        ModelSpec(
            name="qwen3.5-122b", architecture="Qwen3_5MoeForCausalLM", family="gdn",
            hidden_size=3072, vocab_size=248320, layers=interleaved_layers(48, "gdn", every4(48), set(range(48))),
            attention=AttentionDims(num_heads=32, num_kv_heads=2, head_dim=256),
            moe_intermediate_size=1024, num_experts=256, experts_per_token=8,
            gdn=GDNDims(num_k_heads=16, num_v_heads=64, head_k_dim=128, head_v_dim=128, conv_kernel=4),
            source="Qwen3.5-122B-A10B, >= 4 agreeing transcriptions [S2]",
        ),
        ModelSpec(
            name="kimi-linear-48b", architecture="KimiLinearForCausalLM", family="kda",
            hidden_size=2304, vocab_size=163840,
            layers=interleaved_layers(27, "kda", {3, 7, 11, 15, 19, 23, 26}, set(range(1, 27))),
            attention=AttentionDims(num_heads=32, num_kv_heads=32, head_dim=128, kind="mla", kv_lora_rank=512,
                                    qk_rope_head_dim=64),
            intermediate_size=9216, moe_intermediate_size=1024, num_experts=256, experts_per_token=8,
            kda=KDADims(num_heads=32, head_dim=128, conv_kernel=4, gate_lower_bound=None),
            source="Kimi-Linear-48B-A3B linear_attn_config [S2]",
        ),
        ModelSpec(
            name="glm-5.3-flash", architecture="Glm5NextForCausalLM", family="kda",
            hidden_size=4096, vocab_size=154880,
            layers=interleaved_layers(45, "kda", set(range(3, 45, 4)), set(range(3, 45))),
            attention=AttentionDims(num_heads=64, num_kv_heads=64, head_dim=256, kind="mla", kv_lora_rank=512,
                                    qk_rope_head_dim=0),
            intermediate_size=12288, moe_intermediate_size=2048, num_experts=288, experts_per_token=8,
            kda=KDADims(num_heads=64, head_dim=128, conv_kernel=4, gate_lower_bound=-5.0),
            source="GLM-5.3-Flash geometry file + test fixtures [S2]/[T]",
            notes=("DSA (sparse NoPE MLA) attention layers; indexer 32 x 128",),
        ),
        # Tiny models for CPU examples and tests: production per-head geometry (so the same kernel modules), few
        # heads and layers, small vocabularies.
        ModelSpec(
            name="tiny-nemotron", architecture="NemotronHForCausalLM", family="mamba2",
            hidden_size=256, vocab_size=512, layers=nemotron_layers("M-M*M-"),
            attention=AttentionDims(num_heads=4, num_kv_heads=2, head_dim=64), intermediate_size=512,
            mamba2=Mamba2Dims(nheads=4, head_dim=64, d_state=128, n_groups=2, conv_kernel=4, chunk_size=128),
            source="tiny demo model (Nemotron-3-Super head geometry)",
        ),
        ModelSpec(
            name="tiny-qwen", architecture="Qwen3_5ForCausalLM", family="gdn",
            hidden_size=256, vocab_size=512, layers=interleaved_layers(4, "gdn", every4(4)),
            attention=AttentionDims(num_heads=4, num_kv_heads=2, head_dim=64), intermediate_size=512,
            gdn=GDNDims(num_k_heads=1, num_v_heads=2, head_k_dim=128, head_v_dim=128, conv_kernel=4),
            source="tiny demo model (Qwen3.5 head geometry)",
        ),
        # Byte-level models trained on the offline corpus (trtllm_replayssm/lab/train.py, build_scripts/
        # train_models.py) for the accuracy study: production per-head state geometry, about 25M parameters;
        # attention over the last 256 tokens (the training windows' length), so that 128K-token decodes stay in
        # distribution and cost a fixed amount per token.
        ModelSpec(
            name="byte-nemotron", architecture="NemotronHForCausalLM", family="mamba2",
            hidden_size=512, vocab_size=256, layers=nemotron_layers("M-M-M*M-M-M-"),
            attention=AttentionDims(num_heads=8, num_kv_heads=2, head_dim=64, sliding_window=256), intermediate_size=1536,
            mamba2=Mamba2Dims(nheads=16, head_dim=64, d_state=128, n_groups=8, conv_kernel=4, chunk_size=128),
            source="byte-level accuracy model (Nemotron-3 head geometry)",
        ),
        ModelSpec(
            name="byte-qwen", architecture="Qwen3_5ForCausalLM", family="gdn",
            hidden_size=512, vocab_size=256, layers=interleaved_layers(8, "gdn", every4(8)),
            attention=AttentionDims(num_heads=8, num_kv_heads=2, head_dim=64, sliding_window=256), intermediate_size=1536,
            gdn=GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=128, head_v_dim=128, conv_kernel=4),
            source="byte-level accuracy model (Qwen3.5 head geometry)",
        ),
    ]
    return {p.name: p for p in presets}


PRESETS: dict[str, ModelSpec] = _build_presets()


def list_presets() -> list[str]:
    """Names of the built-in presets."""
    return list(PRESETS)


def get_preset(name: str) -> ModelSpec:
    """The built-in preset ``name``; ValueError listing the known names otherwise."""
    try:
        return PRESETS[name.strip().lower()]
    except KeyError:
        raise ValueError(f"model: unknown preset {name!r}; expected one of {list_presets()}") from None
