"""Our implementations as benchmark cases: replay decode on a :class:`ReplayStateCache` and the baseline state update.

Each builder returns a :class:`~trtllm_replayssm.lab.bench.peers.PeerCase` whose ``calls[p]`` runs one decode step on
pool p (its own cache: checkpoint, rings, cursors). Cursors start staggered, ``cursor[slot of row r] = r % L``, and the
rings hold valid random records, so a whole L-cycle visits every cursor value once per row.
"""
from __future__ import annotations

import importlib
from collections.abc import Callable

import torch

from .inputs import DeltaStep, Mamba2Step, random_state, slot_indices
from .peers import PeerCase, PeerUnavailable
from .shapes import BenchShape


def _ops(family: str):  # -> module trtllm_replayssm.core.ops.<family>
    try:
        return importlib.import_module(f"trtllm_replayssm.core.ops.{family}")
    except Exception as exc:
        raise PeerUnavailable(f"trtllm_replayssm.core.ops.{family} not importable: {type(exc).__name__}: {exc}") from exc


def resolved_mode(family: str, mode: str, batch: int, heads: int, state_dtype: str, device: torch.device) -> str:
    """``replay`` or ``flush``: what the op does for `mode` at this batch (the ops' adaptive rule for ``auto``)."""
    try:
        from trtllm_replayssm.core.jit.configs import dtype_from_name
        from trtllm_replayssm.core.ops.launch import force_flush_for
    except Exception as exc:
        raise PeerUnavailable(f"trtllm_replayssm.core.ops not importable: {type(exc).__name__}: {exc}") from exc
    flush = force_flush_for(family, mode, batch, heads, dtype_from_name(state_dtype), device)
    return "flush" if flush else "replay"


def _new_cache(shape: BenchShape, slots: int, state_dtype: str, buffer_len: int, device: torch.device):
    from trtllm_replayssm.core.cache import ReplayStateCache

    if shape.family == "mamba2":
        return ReplayStateCache.mamba2(1, slots, shape.heads, shape.head_dim, shape.key_dim, shape.key_heads,
                                       buffer_len=buffer_len, state_dtype=state_dtype, device=device)
    if shape.family == "gdn":
        return ReplayStateCache.gdn(1, slots, shape.key_heads, shape.heads, shape.key_dim, shape.head_dim,
                                    buffer_len=buffer_len, state_dtype=state_dtype, device=device)
    return ReplayStateCache.kda(1, slots, shape.heads, shape.head_dim, buffer_len=buffer_len,
                                state_dtype=state_dtype, device=device)


def _fill_layer(layer, shape: BenchShape, state_dtype: str, idx: torch.Tensor, buffer_len: int,
                gen: torch.Generator, device: torch.device) -> None:
    """Random checkpoint, valid ring records, staggered cursors ``row % L`` for the batch rows' slots."""
    layer.state.copy_(random_state(layer.state.shape[0], shape, state_dtype, gen, device))
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=gen))
    dev_gen = torch.Generator(device=device).manual_seed(seed)
    for name in ("x_ring", "B_ring", "u_ring", "k_ring"):  # activation rings (design.md buffer table)
        if hasattr(layer, name):
            getattr(layer, name).normal_(0.0, 0.1, generator=dev_gen)
    if hasattr(layer, "dt_ring"):  # Δ after bias + softplus
        layer.dt_ring.uniform_(1e-3, 1e-1, generator=dev_gen)
    if hasattr(layer, "g_ring"):  # inclusive cumulative log-gates: negative, decreasing along the ring
        steps = torch.empty_like(layer.g_ring).uniform_(-0.1, -1e-3, generator=dev_gen)
        layer.g_ring.copy_(steps.cumsum(dim=2))
    layer.cursor.zero_()
    layer.arrive.zero_()
    rows = torch.arange(idx.numel(), device=device, dtype=torch.int32)
    layer.cursor[idx.long()] = rows % buffer_len


def _mamba2_replay_call(ops, layer, step: Mamba2Step, idx: torch.Tensor, out: torch.Tensor,
                        mode: str) -> Callable[[], None]:
    return lambda: ops.replay_decode(layer, step.x, step.dt, step.A, step.B, step.C, D=step.D, z=None,
                                     dt_bias=step.dt_bias, dt_softplus=True, state_batch_indices=idx, out=out,
                                     mode=mode)


def _delta_replay_call(ops, layer, step: DeltaStep, idx: torch.Tensor, out: torch.Tensor,
                       mode: str) -> Callable[[], None]:
    return lambda: ops.replay_decode(layer, step.q, step.k, step.v, step.a, step.b, step.A_log, step.dt_bias,
                                     state_batch_indices=idx, out=out, mode=mode)


def replay_case(shape: BenchShape, batch: int, state_dtype: str, step: Mamba2Step | DeltaStep, n_pools: int,
                buffer_len: int, mode: str, gen: torch.Generator, device: torch.device) -> PeerCase:
    """``ops.<family>.replay_decode`` on `n_pools` independent single-layer caches of ``batch + 1`` slots."""
    ops = _ops(shape.family)
    out = torch.empty(batch, shape.heads, shape.head_dim, dtype=torch.bfloat16, device=device)
    calls = []
    for _ in range(n_pools):
        cache = _new_cache(shape, batch + 1, state_dtype, buffer_len, device)
        layer = cache.layer(0)
        idx = slot_indices(batch, gen, device)
        _fill_layer(layer, shape, state_dtype, idx, buffer_len, gen, device)
        make = _mamba2_replay_call if shape.family == "mamba2" else _delta_replay_call
        calls.append(make(ops, layer, step, idx, out, mode))
    return PeerCase("replay", calls, variant=f"mode={mode}", outputs=[out])


def baseline_case(shape: BenchShape, batch: int, state_dtype: str, step: Mamba2Step | DeltaStep, n_pools: int,
                  gen: torch.Generator, device: torch.device) -> PeerCase:
    """``ops.<family>.state_update`` (read S, update, write S) on `n_pools` state pools of ``batch + 1`` slots."""
    ops = _ops(shape.family)
    out = torch.empty(batch, shape.heads, shape.head_dim, dtype=torch.bfloat16, device=device)
    calls = []
    for _ in range(n_pools):
        state = random_state(batch + 1, shape, state_dtype, gen, device)
        idx = slot_indices(batch, gen, device)
        if shape.family == "mamba2":
            calls.append(lambda s=state, i=idx: ops.state_update(
                s, step.x, step.dt, step.A, step.B, step.C, D=step.D, z=None, dt_bias=step.dt_bias,
                dt_softplus=True, state_batch_indices=i, out=out))
        else:
            calls.append(lambda s=state, i=idx: ops.state_update(
                s, step.q, step.k, step.v, step.a, step.b, step.A_log, step.dt_bias, state_batch_indices=i, out=out))
    return PeerCase("baseline", calls, outputs=[out])
