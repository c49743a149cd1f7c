"""build_scripts/precompile_test_kernels.py finds the kernel modules the GPU test files name at module level."""
import importlib.util
from pathlib import Path

import pytest
import torch

from trtllm_replayssm.core.families import get_family
from trtllm_replayssm.core.formats import parse_state_label, torch_dtype
from trtllm_replayssm.serving.catalog import label_configs
from trtllm_replayssm.serving.presets import get_preset

SCRIPT = Path(__file__).resolve().parents[1] / "build_scripts" / "precompile_test_kernels.py"


def _script():
    spec = importlib.util.spec_from_file_location("precompile_test_kernels", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_quantized_tests_modules_are_all_listed():
    import test_quantized_gpu as q

    names = {c.name for c in _script().gpu_test_kernel_configs(("test_quantized_gpu",))}
    for key, dims in q.DIMS_OF.items():
        family = get_family(key.split("-")[0])
        for spec in q.SPECS.values():
            state = spec if spec.stored else torch_dtype(spec.format, "state")
            assert {c.name for c in family.kernel_configs(dims, state, torch.bfloat16)} <= names, (key, spec.label)


def test_preset_modules_cover_each_spec_and_refuse_a_lone_flag():
    script = _script()
    names = {c.name for c in label_configs(["nemotron-3-nano-4b", "qwen3.5-4b"], ["fp32", "nvfp4"])}
    for model in ("nemotron-3-nano-4b", "qwen3.5-4b"):
        dims = get_preset(model).ssm_dims
        family = get_family(dims.family)
        for state in (torch.float32, parse_state_label("nvfp4")):
            assert {c.name for c in family.kernel_configs(dims, state, torch.bfloat16)} <= names, (model, state)
    assert any(n.startswith("mamba2_p80") for n in names) and any(n.startswith("gdn_") for n in names)
    with pytest.raises(SystemExit):
        script.main(["--models", "qwen3.5-4b"])


def test_families_keep_their_modules_only_and_name_the_known_ones(capsys):
    script = _script()
    assert script.main(["--list", "--models", "nemotron-3-nano-4b,qwen3.5-4b", "--specs", "nvfp4",
                        "--families", "mamba2"]) == 0
    listed = capsys.readouterr().out.split()
    assert listed and all(n.startswith("mamba2_") for n in listed)
    with pytest.raises(SystemExit):
        script.main(["--list", "--models", "nemotron-3-nano-4b", "--specs", "nvfp4", "--families", "gdn"])
    assert "--families: no module of ['gdn'] here; expected some of ['conv', 'mamba2']" in capsys.readouterr().err
