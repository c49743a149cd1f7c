"""The speculative commit of every family: ``torch.ops.replayssm.spec_commit``.

After a verify of a window of T tokens (``mamba2_spec.verify_decode``, ...), each row's accepted count (a device
tensor, the bonus token counted) joins its committed history: a cursor move (``core/spec_cursor.py``), no host sync,
CUDA-graph safe. CUDA tensors run ``plugins/spec_commit.cu``; CPU tensors the reference ``spec_cursor.commit_``.
"""
from __future__ import annotations

import torch

from trtllm_replayssm.core import checks as chk
from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.jit.configs import KernelConfig
from trtllm_replayssm.core.jit.loader import get_kernel, launch
from trtllm_replayssm.core.layouts import SPEC_COMMIT_PARAMS
from trtllm_replayssm.core.limits import MAX_WINDOW
from trtllm_replayssm.core.ops.launch import STATE_BLOCK, define_op, ptr

KERNEL = "spec_commit_kernel"
KERNEL_CONFIG = KernelConfig(family="spec", source="spec_commit.cu", kernels=(KERNEL,), layouts=(SPEC_COMMIT_PARAMS,))


def check_window(window: object, ring_len: int) -> int:
    """``window`` (tokens per verify, 1..MAX_WINDOW) if a ring of ``ring_len`` records holds it; ValueError naming
    the argument otherwise."""
    chk.check_int("window", window)
    if not 1 <= window <= MAX_WINDOW:
        raise ValueError(f"window: expected 1..{MAX_WINDOW} tokens per verify (1 + drafts), got {window}")
    if ring_len < spec_cursor.min_ring_len(window):
        raise ValueError(f"window: {window} tokens need rings of at least {spec_cursor.min_ring_len(window)} records "
                         f"(a window after a fold, then the next), the layer's hold {ring_len}")
    return window


def _commit_cpu(cursor: torch.Tensor, accepted: torch.Tensor, state_batch_indices: torch.Tensor, pad_slot_id: int,
                window: int, ring_len: int) -> None:
    for layer_cursor in cursor:
        spec_cursor.commit_(layer_cursor, accepted, state_batch_indices, pad_slot_id, window)


def _commit_cuda(cursor, accepted, state_batch_indices, pad_slot_id, window, ring_len) -> None:
    layers, slots = cursor.shape
    batch = state_batch_indices.shape[0]
    if batch == 0 or layers == 0:
        return
    params = SPEC_COMMIT_PARAMS.pack(cursor=ptr(cursor), accepted=ptr(accepted), slot_idx=ptr(state_batch_indices),
                                     batch=batch, pad_slot_id=pad_slot_id, slots=slots, window=window,
                                     ring_len=ring_len, layers=layers)
    threads = STATE_BLOCK[0]
    launch(get_kernel(KERNEL_CONFIG, KERNEL, cursor.device), ((layers * batch + threads - 1) // threads, 1, 1),
           STATE_BLOCK, params)


_commit_op = define_op("spec_commit", ("cursor",), _commit_cpu, _commit_cuda)


def commit(layer: object, accepted: torch.Tensor, state_batch_indices: torch.Tensor | None = None,
           pad_slot_id: int = -1, window: int = 1) -> None:
    """After a verify of ``window`` tokens on ``layer`` (any family's layer cache): row b keeps its first
    ``accepted[b]`` window tokens ([b] int32 on the layer's device, 1..window, the bonus token counted). On CUDA a
    row with a count outside 1..window keeps its cursor (the CPU reference raises); rows whose ids are outside the
    slots or repeat an earlier row's commit nothing (:func:`commit_layers`)."""
    commit_layers(layer.cursor.unsqueeze(0), layer.buffer_len, accepted, state_batch_indices, pad_slot_id, window)


def commit_layers(cursor: torch.Tensor, ring_len: int, accepted: torch.Tensor,
                  state_batch_indices: torch.Tensor | None = None, pad_slot_id: int = -1, window: int = 1) -> None:
    """:func:`commit` of every layer of a cache in one launch: ``cursor`` [layers, slots] int32, contiguous
    (``ReplayStateCache.cursor``, rings of ``ring_len`` records); row b names slot ``state_batch_indices[b]`` in
    every layer. Unlike the decode ops' ids, these may break the row contract: a row whose id is outside
    ``[0, slots)`` or repeats an earlier row's slot commits nothing, on every device (``spec_cursor.commit_``)."""
    check_window(window, ring_len)
    chk.check_tensor("cursor", cursor, (None, None), (torch.int32,), inner_contiguous=2)
    chk.check_tensor("accepted", accepted, (None,), (torch.int32,), cursor.device)
    if state_batch_indices is None:
        idx = chk.slot_indices("state_batch_indices", None, accepted.shape[0], cursor.shape[1], pad_slot_id,
                               cursor.device)
    else:
        idx = chk.check_tensor("state_batch_indices", state_batch_indices, accepted.shape, (torch.int32,),
                               cursor.device)
    _commit_op(cursor, accepted, idx, pad_slot_id, window, ring_len)
