"""The cursor word of a layer decoded speculatively (verify + commit), one int32 per slot.

A speculative slot's committed history is ``count`` ring records starting at ring position ``origin`` (positions
wrap modulo the ring length R): the word is ``origin | count << 8``, so the prefill hand-off's cursor 0 is an empty
history at position 0. A verify of T tokens first folds the history into a new checkpoint when the history, the
window and the next window would overrun the ring (:func:`folds_before`), then writes the window's records at the
positions after the history; a fold moves the origin past the folded records, so the window never lands on a record
the fold still reads (the verify kernels fold and write in one launch). A commit adds the accepted count.
plugins/replayssm_common.cuh (``rssm::SpecCursor``) holds the same rule.
"""
from __future__ import annotations

import torch

ORIGIN_BITS = 8
ORIGIN_MASK = (1 << ORIGIN_BITS) - 1


def pack(origin: int, count: int) -> int:
    """The cursor word of ``count`` committed records from ring position ``origin``."""
    return origin | count << ORIGIN_BITS


def unpack(word: int) -> tuple[int, int]:
    """``(origin, count)`` of a cursor word."""
    return word & ORIGIN_MASK, word >> ORIGIN_BITS


def folds_before(count: int, window: int, ring_len: int) -> bool:
    """Whether a verify of ``window`` tokens folds the ``count`` committed records first: the history, this window
    and the next would not fit in the ring (``count + 2 window > ring_len``)."""
    return count + 2 * window > ring_len


def valid(word: int, window: int, ring_len: int) -> bool:
    """Whether a verify of ``window`` tokens can run from cursor ``word`` (a commit of 1..window accepted tokens
    after each verify keeps it so): origin inside the ring, history plus window within it."""
    origin, count = unpack(word)
    return word >= 0 and origin < ring_len and count + window <= ring_len


def min_ring_len(window: int) -> int:
    """The shortest ring that verifies windows of ``window`` tokens: a window after a fold (count 0 up to
    ``window``) needs ``2 window`` records."""
    return 2 * window


def ring_len(buffer_len: int, window: int) -> int:
    """Ring records of a layer verified in windows of ``window`` tokens with ring length ``buffer_len`` (L): L + T,
    so that a fold takes L - T + 1 .. L committed records (serving/speculative.py), at least min_ring_len."""
    return max(buffer_len + window, min_ring_len(window))


def commit_(cursor: torch.Tensor, accepted: torch.Tensor, state_batch_indices: torch.Tensor, pad_slot_id: int,
            window: int) -> None:
    """After a verify of ``window`` tokens (the float32 reference of every family's commit): each row's first
    ``accepted[b]`` window tokens (1 .. window, the bonus token counted) join its committed history; the rest are
    never read again. A row commits nothing where its id is ``pad_slot_id`` or outside ``[0, slots)``, or repeats
    the slot of an earlier row (the rule of the CUDA commit, so that serving passes upstream's decode-row ids, whose
    CUDA-graph padding rows repeat a dummy slot, as they are)."""
    seen: set[int] = set()
    for b in range(state_batch_indices.shape[0]):
        slot = int(state_batch_indices[b])
        if slot == pad_slot_id or not 0 <= slot < cursor.shape[0] or slot in seen:
            continue
        seen.add(slot)
        a = int(accepted[b])
        if not 1 <= a <= window:
            raise ValueError(f"accepted: expected 1..{window} per row (the bonus token included), got {a} in row {b}")
        origin, count = unpack(int(cursor[slot]))
        cursor[slot] = pack(origin, count + a)
