"""Presets and Hugging Face config parsing (fixtures hold the published config values)."""
import json
from dataclasses import replace
from pathlib import Path

import pytest

from trtllm_replayssm.serving.hf_config import SUPPORTED_ARCHITECTURES, ConfigError, load_config_dir, spec_from_config
from trtllm_replayssm.serving.presets import LayerPlan, get_preset, list_presets

FIX = Path(__file__).parent / "fixtures" / "hf_configs"


def test_preset_names_and_unknown():
    assert list_presets() == ["nemotron-3-nano-4b", "nemotron-3-super-120b", "qwen3.5-4b", "qwen3.5-122b",
                              "kimi-linear-48b", "glm-5.3-flash", "tiny-nemotron", "tiny-qwen", "byte-nemotron",
                              "byte-qwen"]
    with pytest.raises(ValueError, match="unknown preset 'nope'.*nemotron-3-nano-4b"):
        get_preset("nope")


def test_tiny_and_byte_presets_need_no_kernel_modules_of_their_own():
    from trtllm_replayssm.serving.catalog import catalog_configs

    lab = ["tiny-nemotron", "tiny-qwen", "byte-nemotron", "byte-qwen"]
    production = [n for n in list_presets() if n not in lab]
    assert set(catalog_configs(lab)) <= set(catalog_configs(production))


@pytest.mark.parametrize("name,family,n_ssm,n_attn,state_mib", [
    ("nemotron-3-nano-4b", "mamba2", 21, 4, 3.75),
    ("nemotron-3-super-120b", "mamba2", 40, 8, 4.0),
    ("qwen3.5-4b", "gdn", 24, 8, 2.0),
    ("qwen3.5-122b", "gdn", 36, 12, 4.0),
    ("kimi-linear-48b", "kda", 20, 7, 2.0),
    ("glm-5.3-flash", "kda", 34, 11, 4.0),
])
def test_preset_layer_counts_and_state(name, family, n_ssm, n_attn, state_mib):
    spec = get_preset(name)
    assert spec.family == family and spec.ssm_dims is getattr(spec, family)
    assert len(spec.ssm_layers) == n_ssm and len(spec.attention_layers) == n_attn
    assert spec.ssm_dims.state_elems * 4 / 2**20 == state_mib  # fp32 state per layer per sequence


def test_nano4b_attention_layers_and_head_dim_80():
    spec = get_preset("nemotron-3-nano-4b")
    assert spec.attention_layers == [12, 17, 24, 32]
    assert spec.mamba2.head_dim == 80 and spec.mamba2.d_inner == 7680


def test_layer_plan_rejects_bad_kind():
    with pytest.raises(ValueError, match="LayerPlan.kind"):
        LayerPlan(0, "rnn")


def test_spec_rejects_layers_of_other_family():
    spec = get_preset("qwen3.5-4b")
    with pytest.raises(ValueError, match="not of family"):
        replace(spec, layers=spec.layers + (LayerPlan(99, "mamba2"),))


@pytest.mark.parametrize("fixture,preset", [("nemotron3_super", "nemotron-3-super-120b"),
                                            ("qwen35_4b", "qwen3.5-4b"), ("qwen35_122b", "qwen3.5-122b"),
                                            ("kimi_linear_48b", "kimi-linear-48b")])
def test_config_matches_preset(fixture, preset):
    got, want = load_config_dir(FIX / fixture), get_preset(preset)
    assert got.family == want.family
    assert got.ssm_dims == want.ssm_dims
    assert got.layers == want.layers
    assert got.attention == want.attention
    assert (got.hidden_size, got.vocab_size) == (want.hidden_size, want.vocab_size)
    assert got.ssm_state_dtype == "fp32"


def test_text_config_nesting_and_full_attention_interval():
    cfg = json.loads((FIX / "qwen35_4b" / "config.json").read_text())
    del cfg["text_config"]["layer_types"]  # falls back to full_attention_interval
    spec = spec_from_config(cfg)
    assert spec.attention_layers == list(range(3, 32, 4))
    assert spec.gdn.num_v_heads == 32


def test_inner_size_from_heads_not_expand():
    cfg = json.loads((FIX / "nemotron3_super" / "config.json").read_text())
    cfg["expand"] = 7
    assert spec_from_config(cfg).mamba2.d_inner == 128 * 64


def test_unknown_architecture_lists_supported():
    with pytest.raises(ConfigError, match="unsupported architecture 'LlamaForCausalLM'.*NemotronHForCausalLM"):
        spec_from_config({"architectures": ["LlamaForCausalLM"]})
    assert "KimiLinearForCausalLM" in SUPPORTED_ARCHITECTURES


def test_missing_field_named():
    cfg = json.loads((FIX / "nemotron3_super" / "config.json").read_text())
    del cfg["mamba_head_dim"]
    with pytest.raises(ConfigError, match="missing field 'mamba_head_dim'"):
        spec_from_config(cfg)


def test_missing_config_json(tmp_path):
    with pytest.raises(ConfigError, match="has no config.json"):
        load_config_dir(tmp_path)
