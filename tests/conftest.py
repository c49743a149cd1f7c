import os
from collections.abc import Iterator

import pytest
import torch
from delta_rule_harness import flush_denormals

if not torch.cuda.is_available():
    # Triton kernels (fla-core's peers) run in Triton's interpreter on a CPU; it must be on before Triton is imported.
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def no_subnormals() -> Iterator[None]:
    """CPU float32 subnormals flushed to zero for the test (see delta_rule_harness.flush_denormals)."""
    with flush_denormals():
        yield
