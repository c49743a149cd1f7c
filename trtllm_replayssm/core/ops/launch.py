"""What every family's ops share: the custom-op definition (CPU reference, CUDA kernels, fake impl), tensor
addresses for the parameter structs, and running a LaunchPlan's kernels."""
from __future__ import annotations

import ctypes
from typing import Callable

import torch

from trtllm_replayssm.core.jit.configs import KernelConfig
from trtllm_replayssm.core.jit.loader import allow_dynamic_shared, get_kernel, launch, prefer_max_shared
from trtllm_replayssm.core.limits import NUM_WARPS
from trtllm_replayssm.core.plans import Launch

STATE_BLOCK = (32 * NUM_WARPS, 1, 1)
PERSISTENT_BLOCK = (32 * (NUM_WARPS + 1), 1, 1)  # + the producer warp


def define_op(name: str, mutates_args: tuple[str, ...], cpu_impl: Callable, cuda_impl: Callable):
    """``torch.ops.replayssm.<name>``: ``cpu_impl`` (annotated; its signature is the op's schema) runs on CPU
    tensors, ``cuda_impl`` on CUDA tensors; the fake impl returns nothing (the ops mutate their arguments)."""
    op = torch.library.custom_op(f"replayssm::{name}", mutates_args=mutates_args)(cpu_impl)
    op.register_kernel("cuda")(cuda_impl)
    op.register_fake(_no_result)
    return op


def _no_result(*args, **kwargs) -> None:
    return None


def ptr(t: torch.Tensor | None) -> int:
    return 0 if t is None else t.data_ptr()


def vector_elems(t: torch.Tensor) -> int:
    """Elements of ``t``'s dtype in a 16-byte vector."""
    return 16 // t.element_size()


def vectorizable(elems: int, tensors: list[torch.Tensor | None], strides: list[int]) -> bool:
    """Whether ``elems``-element vectors stay 16-byte aligned in every tensor at every given stride."""
    return all(t is None or t.data_ptr() % 16 == 0 for t in tensors) and all(s % elems == 0 for s in strides)


def stride(t: torch.Tensor | None, dim: int) -> int:
    return 0 if t is None else t.stride(dim)


def stored_fields(tensors: tuple[torch.Tensor | None, ...] = (None,) * 6, seed: int = 0) -> dict[str, int]:
    """The parameter-struct fields of a checkpoint's tensors besides its master data (Checkpoint.op_tensors order;
    all null for a plain pool) and its stochastic-rounding seed."""
    scale, block, read, read_scale, read_block, flushes = tensors
    return dict(state_scale=ptr(scale), state_bscale=ptr(block), read=ptr(read), read_scale=ptr(read_scale),
                read_bscale=ptr(read_block), flushes=ptr(flushes), seed=seed)


def step_rows(step: torch.Tensor | None) -> int:
    """Address of the per-row words of a cache's ``step`` scratch (0 without one): ``step[1:]``; ``step[0]`` is the
    persistent main kernel's tile-claim counter, which the kernels address as ``step[-1]`` of the rows."""
    return 0 if step is None else step.data_ptr() + step.element_size()


def run_plan(config: KernelConfig, names: dict[str, str], plan: Launch, params: ctypes.Structure,
             device: torch.device, prep_carveout: bool, flush_config: KernelConfig | None = None) -> None:
    """Launch the kernels of ``plan`` from ``config``: ``names`` maps ``state`` (baseline), ``flush``, ``fused``,
    ``fused_stream``, ``prep``, ``main``, ``flush_rows`` and ``grid`` to kernel names (those the plan's modes use);
    ``fused`` runs the state kernels' grid with the plan's ``fold_bytes`` of dynamic shared memory, or, where the plan
    has stages, ``fused_stream`` over the plan's grid with its stages and records. Replay: prep (programmatic dependent
    of the kernel before it if the plan says so; with ``prep_carveout`` asking for the main kernel's shared-memory
    carveout), then the persistent main kernel (always a programmatic dependent of prep), with the plan's stages, fold
    buffer and tail start written into ``params``, and, where the plan keeps flush rows apart (``flush_ctas``),
    ``flush_rows`` from ``flush_config`` (default: ``config``) with the plan's ``flush_bytes`` of dynamic shared
    memory (a programmatic dependent of the main kernel). Grid: prep where the plan has one
    (``prep_threads``), then the ``grid`` kernel over the plan's state-kernel grid. The state kernels are
    programmatic dependents of the kernel before them where the plan says so, hinting L2 before their wait where it
    says ``l2_hints``."""
    params.l2_hints = int(plan.l2_hints)  # set by the planner for state-kernel plans only
    if plan.mode in ("baseline", "flush"):
        function = get_kernel(config, names["state" if plan.mode == "baseline" else "flush"], device)
        launch(function, plan.grid, STATE_BLOCK, params, programmatic=plan.programmatic)
        return
    if plan.mode == "fused" and plan.stages:
        function = get_kernel(config, names["fused_stream"], device)
        params.stages = plan.stages
        allow_dynamic_shared(function, plan.shared_bytes)
        launch(function, plan.grid, STATE_BLOCK, params, shared_bytes=plan.shared_bytes,
               programmatic=plan.programmatic)
        return
    if plan.mode == "fused":
        function = get_kernel(config, names["fused"], device)
        allow_dynamic_shared(function, plan.fold_bytes)
        launch(function, plan.grid, STATE_BLOCK, params, shared_bytes=plan.fold_bytes, programmatic=plan.programmatic)
        return
    if plan.mode == "grid" and not plan.prep_threads:
        launch(get_kernel(config, names["grid"], device), plan.grid, STATE_BLOCK, params, programmatic=plan.programmatic)
        return
    prep = get_kernel(config, names["prep"], device)
    if prep_carveout:
        prefer_max_shared(prep)  # the main kernel's carveout: an SM need not drain between the two
    launch(prep, plan.prep_grid, (plan.prep_threads, 1, 1), params, programmatic=plan.programmatic_prep)
    if plan.mode == "grid":
        launch(get_kernel(config, names["grid"], device), plan.grid, STATE_BLOCK, params)
        return
    main = get_kernel(config, names["main"], device)
    params.stages, params.stage_bytes, params.fold_bytes = plan.stages, plan.stage_bytes, plan.fold_bytes
    params.tail_start = plan.tail_start
    if plan.flush_ctas:
        params.flush_apart = 1
    shared = plan.stages * plan.stage_bytes + plan.fold_bytes
    allow_dynamic_shared(main, shared)
    launch(main, plan.grid, PERSISTENT_BLOCK, params, shared_bytes=shared, programmatic=True)
    if plan.flush_ctas:
        flush_rows = get_kernel(flush_config or config, names["flush_rows"], device)
        allow_dynamic_shared(flush_rows, plan.flush_bytes)
        launch(flush_rows, (plan.flush_ctas, 1, 1), STATE_BLOCK, params, shared_bytes=plan.flush_bytes,
               programmatic=True)
