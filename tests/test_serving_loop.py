"""A serving schedule through the TensorRT-LLM glue's core against each request's float64 recurrence (see
serving_loop.py): CPU (the fallback ops) in CI; the H200 runs the kernels, CUDA graphs per padded batch size, 200
steps, with flat memory."""
import pytest
import torch

from serving_loop import run
from trtllm_replayssm.core.formats import parse_state_label

# Output error against the unquantized float64 recurrence that FP8/NVFP4 codes in a bf16 pool stay under (quantization
# error; codes corrupted by the pool's values, or values never written where upstream reads, give errors of 1 or more)
CODES_TOL = {"fp8": 0.15, "nvfp4/dual/fp8": 0.4}


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_serving_loop_cpu(family):
    rep = run(family, "cpu", buffer_len=4, steps=40, graphs=False, max_length=10, seed=3)
    print(rep)
    assert rep.decode_rows > 40 * 2 and rep.finished >= 10 and rep.reused_blocks >= 5 and rep.mixed_steps >= 5
    assert rep.pad_rows >= 4
    assert rep.worst_rel_err < 1e-4


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("label", sorted(CODES_TOL))
def test_serving_loop_codes_in_the_pool_cpu(family, label):
    """FP8/NVFP4 codes in a bf16 unified pool: prefills encoded, GDN's mixed-batch decode rows given values and
    encoded again, through the same schedule."""
    rep = run(family, "cpu", buffer_len=4, steps=40, graphs=False, max_length=10, seed=3,
              state=parse_state_label(label))
    print(rep)
    assert rep.decode_rows > 40 * 2 and rep.finished >= 10 and rep.reused_blocks >= 5 and rep.mixed_steps >= 5
    assert rep.worst_rel_err < CODES_TOL[label]


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
@pytest.mark.parametrize("label", sorted(CODES_TOL))
def test_serving_loop_codes_in_the_pool_gpu_graphs(family, label):
    """The codes schedule on the kernels, generation-only steps as CUDA graphs (graph = eager bit for bit)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rep = run(family, "cuda", buffer_len=16, steps=200, graphs=True, seed=4, state=parse_state_label(label))
    print(rep)
    assert rep.graph_steps >= 50 and rep.mixed_steps >= 5 and rep.graph_eager_checks == 4 and rep.pad_rows >= 20
    assert rep.worst_rel_err < CODES_TOL[label]


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_serving_loop_gpu_graphs(family):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rep = run(family, "cuda", buffer_len=16, steps=200, graphs=True, seed=4)
    print(rep)
    assert rep.decode_rows > 200 * 2 and rep.finished >= 5 and rep.reused_blocks >= 3
    assert rep.graph_steps >= 50 and rep.mixed_steps >= 5 and rep.graph_eager_checks == 4 and rep.pad_rows >= 20
    assert rep.worst_rel_err < 1e-4
    # from the first mixed step on: GDN's mixed steps fold rings with an einsum, whose first call makes PyTorch
    # allocate its cuBLAS workspace once
    steady = rep.memory[rep.first_mixed_step + 1:]
    assert len(steady) > 150 and len(set(steady)) == 1, f"memory not flat across the steps: {sorted(set(steady))}"


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_serving_loop_mtp_cpu(family):
    """MTP: every decode step verifies windows of 3 tokens, then commits random accepted counts (1, 3 and 2)."""
    rep = run(family, "cpu", buffer_len=6, steps=40, graphs=False, max_length=10, seed=5, spec_tokens=2)
    print(rep)
    assert rep.decode_rows > 40 * 2 and rep.finished >= 10 and rep.reused_blocks >= 5 and rep.mixed_steps >= 5
    assert rep.pad_rows >= 4 and rep.accepted_counts == {1, 2, 3}
    assert rep.worst_rel_err < 1e-4


@pytest.mark.gpu
@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_serving_loop_mtp_gpu_graphs(family):
    """The MTP schedule on the verify and commit kernels, generation-only steps (verify + update_mamba_states) as
    CUDA graphs per padded batch size, each checked once against the eager step."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    rep = run(family, "cuda", buffer_len=16, steps=200, graphs=True, seed=6, spec_tokens=3)
    print(rep)
    assert rep.decode_rows > 200 * 2 and rep.finished >= 5 and rep.reused_blocks >= 3 and rep.mixed_steps >= 5
    assert rep.graph_steps >= 50 and rep.graph_eager_checks == 4 and rep.pad_rows >= 20
    assert rep.accepted_counts == {1, 2, 3, 4}
    assert rep.worst_rel_err < 1e-4
