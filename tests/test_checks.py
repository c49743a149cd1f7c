"""Unit tests of the argument checks every op shares (core/checks.py): each error names the argument, says what was
expected and what came, and valid edge cases (size-1 dims, the largest batch) pass."""
from __future__ import annotations

import pytest
import torch

from trtllm_replayssm.core import checks
from test_row_contract import _case, _run

CPU = torch.device("cpu")


def test_check_tensor_errors():
    with pytest.raises(TypeError, match=r"^x: expected a torch.Tensor, got list"):
        checks.check_tensor("x", [1.0], (None,), (torch.float32,))
    with pytest.raises(ValueError, match=r"^x: expected shape \[\*, 3\], got \[2, 4\]"):
        checks.check_tensor("x", torch.zeros(2, 4), (None, 3), (torch.float32,))
    with pytest.raises(ValueError, match=r"^x: expected shape \[\*, 3\], got \[3\]"):
        checks.check_tensor("x", torch.zeros(3), (None, 3), (torch.float32,))
    with pytest.raises(TypeError, match=r"^x: expected dtype in \['torch.float32'\], got torch.float16"):
        checks.check_tensor("x", torch.zeros(2, dtype=torch.float16), (2,), (torch.float32,))
    with pytest.raises(TypeError, match=r"^B: expected the dtype of x \(torch.bfloat16\), got torch.float16"):
        checks.check_tensor("B", torch.zeros(2, dtype=torch.float16), (2,), (torch.bfloat16,), dtype_of="x")
    with pytest.raises(ValueError, match=r"^x: expected a tensor on cpu, got meta"):
        checks.check_tensor("x", torch.zeros(2, device="meta"), (2,), (torch.float32,), CPU)
    assert checks.check_optional("z", None, (2,), (torch.float32,)) is None
    with pytest.raises(ValueError, match=r"^z: expected shape \[2\]"):
        checks.check_optional("z", torch.zeros(3), (2,), (torch.float32,))


def test_check_tensor_inner_dims():
    strided = torch.zeros(2, 3, 8)[..., :4]  # dense last dim, strided middle dim
    assert checks.check_tensor("x", strided, (2, 3, 4), (torch.float32,)) is strided
    with pytest.raises(ValueError, match=r"^x: the last 2 dim\(s\) must be contiguous \(strides \[24, 8, 1\]"):
        checks.check_tensor("x", strided, (2, 3, 4), (torch.float32,), inner_contiguous=2)
    for strided in (torch.zeros(2, 8)[:, ::2], torch.zeros(3, 4)[:, ::2]):
        with pytest.raises(ValueError, match=r"^x: the last 1 dim\(s\) must be contiguous"):
            checks.check_tensor("x", strided, (None, None), (torch.float32,))
    odd = torch.empty_strided((2, 1, 4), (8, 7, 1))  # a size-1 dim's stride is never used
    assert checks.check_tensor("x", odd, (2, 1, 4), (torch.float32,), inner_contiguous=2) is odd
    checks.check_tensor("dt", torch.zeros(4, 3)[:, :2], (4, 2), (torch.float32,), inner_contiguous=0)


def test_check_aligned():
    base = torch.zeros(64)
    checks.check_aligned("x", base[4:].view(3, 20), 4)
    with pytest.raises(ValueError, match=r"^x: rows must be 16-byte aligned for vector loads \(data_ptr % 16 = 4, "):
        checks.check_aligned("x", base[1:], 4)
    with pytest.raises(ValueError, match=r"^x: rows must be 16-byte aligned for vector loads \(data_ptr % 16 = 0, "
                                         r"strides \[5, 1\]\)"):
        checks.check_aligned("x", base[:60].view(12, 5), 4)
    checks.check_aligned("x", base[1:].view(7, 9), 1)  # 4-byte elements: any float32 address
    checks.check_aligned("x", base[4:].view(3, 20), 8)  # 32-byte vectors need only 16-byte alignment
    with pytest.raises(ValueError, match=r"^x: rows must be 8-byte aligned"):
        checks.check_aligned("x", base[1:], 2)


def test_scratch_rows():
    checks.check_scratch_rows(6, 6)
    with pytest.raises(ValueError, match=r"^x: batch 7 exceeds the cache's 6 slots"):
        checks.check_scratch_rows(7, 6)


def test_check_int():
    assert checks.check_int("pad_slot_id", -1) == -1
    for bad in (True, 1.0, None):
        with pytest.raises(TypeError, match=r"^pad_slot_id: expected an int, got "):
            checks.check_int("pad_slot_id", bad)


def test_check_step_values_on_any_tensor():
    idx = torch.tensor([1, -1, 3], dtype=torch.int32)
    cursor = torch.tensor([0, 2, 0, 1], dtype=torch.int32)
    x = torch.zeros(3, 2)
    checks.check_step_values(idx, 4, -1, cursor, 4, rows={"x": x}, params={"A": torch.zeros(2), "D": None})
    with pytest.raises(ValueError, match=r"^state_batch_indices: each slot at most once per call, got repeated ids \[3\]"):
        checks.check_step_values(torch.tensor([3, -1, 3], dtype=torch.int32), 4, -1, cursor, 4, {"x": x}, {})
    with pytest.raises(ValueError, match=r"^layer.cursor: expected values in \[0, 2\) for the batch's slots, got "
                                         r"\{3: 2\}"):
        checks.check_step_values(torch.tensor([1, -1, 3], dtype=torch.int32), 4, -1,
                                 torch.tensor([0, 1, 0, 2], dtype=torch.int32), 2, {"x": x}, {})
    x[1] = float("nan")  # a pad row
    checks.check_step_values(idx, 4, -1, None, 1, rows={"x": x}, params={})
    x[2, 1] = float("inf")
    with pytest.raises(ValueError, match=r"^x: expected finite values, got inf at index \[2, 1\]"):
        checks.check_step_values(idx, 4, -1, None, 1, rows={"x": x}, params={})
    with pytest.raises(ValueError, match=r"^A: expected finite values, got nan at index \[0\]"):
        checks.check_step_values(idx, 4, -1, None, 1, rows={}, params={"A": torch.tensor([float("nan"), 0.0])})


@pytest.mark.parametrize("name", ("mamba2", "gdn", "kda"))
def test_check_values_finds_a_corrupted_cursor(name):
    fam, cache, layer, step = _case(name, "cpu")
    cache.cursor[0, 2] = 99
    with pytest.raises(ValueError, match=r"^layer.cursor: expected values in \[0, 8\) .*\{2: 99\}"):
        _run(fam, layer, step, "replay", [1, 2, 3, 4], check_values=True)


def test_ops_take_strided_rows():
    """Rows may be strided outside their dense inner dims (views into larger activations)."""
    fam, cache, layer, step = _case("mamba2", "cpu")
    dense = _run(fam, layer, step, "baseline", [1, 2, 3, 4]).clone()
    fam, cache, layer, step = _case("mamba2", "cpu")
    wide = torch.zeros(step.x.shape[0], step.x.shape[1], 2 * step.x.shape[2])
    wide[..., :step.x.shape[2]] = step.x
    step.x = wide[..., :step.x.shape[2]]
    torch.testing.assert_close(_run(fam, layer, step, "baseline", [1, 2, 3, 4]), dense, rtol=0, atol=0)
