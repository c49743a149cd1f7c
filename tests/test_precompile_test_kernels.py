"""build_scripts/precompile_test_kernels.py finds the kernel modules the GPU test files name at module level."""
import importlib.util
from pathlib import Path

import torch

from trtllm_replayssm.core.families import get_family
from trtllm_replayssm.core.formats import torch_dtype

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
