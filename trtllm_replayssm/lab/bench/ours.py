"""Our implementations as benchmark cases: replay decode on a replay cache and the baseline state update.

Each builder returns a :class:`~trtllm_replayssm.lab.bench.peers.PeerCase` whose ``calls[p]`` runs one decode step
on pool p (its own cache: checkpoint, rings, cursors) with the launch plan the op's planner made, which the case
records. Cursors start staggered, ``cursor[slot of row r] = r % L``, and the rings hold valid random records, so a
whole L-cycle visits every cursor value once per row.
"""
from __future__ import annotations

import torch

from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import StateSpec, parse_state_label
from trtllm_replayssm.core.plans import Tuning
from trtllm_replayssm.core.samples import DeltaStep, Mamba2Step, fill_rings_, random_state, slot_indices

from .peers import PeerCase
from .shapes import BenchShape

DEFAULT_TUNING = Tuning()


def planned_mode(shape: BenchShape, batch: int, state_dtype: str | StateSpec, buffer_len: int, mode: str,
                 device: torch.device, tuning: Tuning = DEFAULT_TUNING) -> str:
    """What our op runs for ``mode`` at ``batch`` (``replay`` or ``flush``), from its planner."""
    fam = family_of(shape.dims)
    probe = fam.new_cache(shape.dims, 1, 1, buffer_len=buffer_len, state_dtype=state_dtype, device=device)
    return fam.replay_plan(probe.layer(0), batch, mode, tuning).mode


def fill_checkpoints_(layer, shape: BenchShape, gen: torch.Generator) -> None:
    """Random checkpoints in every slot of ``layer`` (a stored one encoded as a flush writes it)."""
    dev = layer.state.device
    if layer.storage is None:
        layer.state.copy_(random_state(layer.slots, shape.dims, layer.state.dtype, gen, dev))
    else:
        layer.checkpoint().store_(torch.arange(layer.slots, device=dev),
                                  random_state(layer.slots, shape.dims, "fp32", gen, dev))


def fill_layer_(layer, shape: BenchShape, idx: torch.Tensor, buffer_len: int, gen: torch.Generator,
                cursor_period: int | None = None) -> None:
    """Random checkpoints (:func:`fill_checkpoints_`), valid ring records, staggered cursors ``row % cursor_period``
    (default L: whole cycles; L - 1: non-flush steps only) for the batch rows' slots."""
    fill_checkpoints_(layer, shape, gen)
    fill_rings_(layer, gen)
    layer.cursor.zero_()
    layer.arrive.zero_()
    rows = torch.arange(idx.numel(), device=idx.device, dtype=torch.int32)
    layer.cursor[idx.long()] = rows % (cursor_period or buffer_len)


def replay_case(shape: BenchShape, batch: int, state_dtype: str | StateSpec, step: Mamba2Step | DeltaStep,
                n_pools: int, buffer_len: int, mode: str, gen: torch.Generator, device: torch.device,
                tuning: Tuning = DEFAULT_TUNING) -> PeerCase:
    """The family's ``replay_decode`` on ``n_pools`` independent single-layer caches of ``batch + 1`` slots
    (``state_dtype``: a StateSpec or its label, e.g. ``nvfp4/dual/fp16``)."""
    fam = family_of(shape.dims)
    spec = parse_state_label(state_dtype, arg="state_dtype")
    args, kwargs = step.op_args()
    out = torch.empty(batch, shape.dims.heads, shape.dims.rows, dtype=torch.bfloat16, device=device)
    calls, plan = [], None
    for _ in range(n_pools):
        layer = fam.new_cache(shape.dims, 1, batch + 1, buffer_len=buffer_len, state_dtype=spec,
                              device=device).layer(0)
        idx = slot_indices(batch, gen, device)
        fill_layer_(layer, shape, idx, buffer_len, gen)
        plan = fam.replay_plan(layer, batch, mode, tuning)
        calls.append(lambda layer=layer, idx=idx, plan=plan: fam.replay_decode(
            layer, *args, **kwargs, state_batch_indices=idx, out=out, plan=plan))
    return PeerCase("replay", calls, variant=f"mode={mode}", outputs=[out], plan=plan.record())


def baseline_case(shape: BenchShape, batch: int, state_dtype: str | StateSpec, step: Mamba2Step | DeltaStep,
                  n_pools: int, gen: torch.Generator, device: torch.device,
                  tuning: Tuning = DEFAULT_TUNING) -> PeerCase:
    """The family's ``state_update`` (read S, update, write S) on ``n_pools`` state pools of ``batch + 1`` slots;
    a stored spec's checkpoint (quantized, dual: the master and the read copy written every step) from a cache."""
    fam = family_of(shape.dims)
    spec = parse_state_label(state_dtype, arg="state_dtype")
    args, kwargs = step.op_args()
    out = torch.empty(batch, shape.dims.heads, shape.dims.rows, dtype=torch.bfloat16, device=device)
    calls, plan = [], None
    for _ in range(n_pools):
        if spec.stored:
            layer = fam.new_cache(shape.dims, 1, batch + 1, state_dtype=spec, device=device).layer(0)
            fill_checkpoints_(layer, shape, gen)
            state = layer.checkpoint()
        else:
            state = random_state(batch + 1, shape.dims, spec.format, gen, device)
        idx = slot_indices(batch, gen, device)
        plan = fam.state_update_plan(state, batch, args[0].dtype, tuning)
        calls.append(lambda s=state, i=idx, plan=plan: fam.state_update(
            s, *args, **kwargs, state_batch_indices=i, out=out, plan=plan))
    return PeerCase("baseline", calls, outputs=[out], plan=plan.record())
