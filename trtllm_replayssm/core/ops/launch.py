"""What every family's ops share: the custom-op definition (CPU reference, CUDA kernels, fake impl), tensor
addresses for the parameter structs, and running a LaunchPlan's kernels."""
from __future__ import annotations

import ctypes
import functools
from dataclasses import dataclass
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


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel launch of a plan: ``kernel`` is the key of the op's kernel names (``state``, ``flush``, ``fused``,
    ``fused_stream``, ``prep``, ``grid``, ``main``, ``flush_rows``), then its grid, block, dynamic shared memory and
    whether it is a programmatic dependent of the kernel before it."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int = 0
    programmatic: bool = False


@functools.lru_cache(maxsize=256)
def plan_launches(plan: Launch) -> tuple[KernelLaunch, ...]:
    """The kernels ``plan`` runs, in order (cached: every op call decodes its plan's words and runs this list).
    ``fused`` runs the state kernels' grid with the plan's records in dynamic shared memory, or, where the plan has
    stages, ``fused_stream`` over the plan's grid with its stages and records. Replay: prep (a programmatic dependent
    of the kernel before it if the plan says so), then the persistent main kernel (always a programmatic dependent of
    prep) with the plan's stages and fold buffer, and, where the plan keeps flush rows apart (``flush_ctas``),
    ``flush_rows`` with the plan's ``flush_bytes`` (a programmatic dependent of the main kernel). Grid: prep where the
    plan has one (``prep_threads``), then the ``grid`` kernel over the plan's state-kernel grid."""
    if plan.mode in ("baseline", "flush"):
        return (KernelLaunch("state" if plan.mode == "baseline" else "flush", plan.grid, STATE_BLOCK, 0,
                             plan.programmatic),)
    if plan.mode == "fused":  # shared_bytes: the records, after the stages of the streaming form
        return (KernelLaunch("fused_stream" if plan.stages else "fused", plan.grid, STATE_BLOCK, plan.shared_bytes,
                             plan.programmatic),)
    if plan.mode == "grid" and not plan.prep_threads:
        return (KernelLaunch("grid", plan.grid, STATE_BLOCK, 0, plan.programmatic),)
    prep = KernelLaunch("prep", plan.prep_grid, (plan.prep_threads, 1, 1), 0, plan.programmatic_prep)
    if plan.mode == "grid":
        return prep, KernelLaunch("grid", plan.grid, STATE_BLOCK)
    main = KernelLaunch("main", plan.grid, PERSISTENT_BLOCK, plan.shared_bytes, True)
    if not plan.flush_ctas:
        return prep, main
    return prep, main, KernelLaunch("flush_rows", (plan.flush_ctas, 1, 1), STATE_BLOCK, plan.flush_bytes, True)


def run_plan(config: KernelConfig, names: dict[str, str], plan: Launch, params: ctypes.Structure,
             device: torch.device, prep_carveout: bool, flush_config: KernelConfig | None = None) -> None:
    """Launch the kernels of ``plan`` (:func:`plan_launches`) from ``config``, ``names`` mapping their keys to kernel
    names, with the plan's numbers the kernels read written into ``params``: the L2 hints (set by the planner for
    state-kernel plans only), the stages of the streaming one-launch replay and the main kernel's stages, fold buffer,
    tail start and flush rows apart. ``prep_carveout``: prep asks for the main kernel's shared-memory carveout, so
    that an SM need not drain between the two; ``flush_config`` (default ``config``): the module of ``flush_rows``."""
    params.l2_hints = int(plan.l2_hints)
    if plan.mode in ("fused", "replay"):
        params.stages = plan.stages
    if plan.mode == "replay":
        params.stage_bytes, params.fold_bytes, params.tail_start = plan.stage_bytes, plan.fold_bytes, plan.tail_start
        params.flush_apart = int(plan.flush_ctas > 0)
    for step in plan_launches(plan):
        module = (flush_config or config) if step.kernel == "flush_rows" else config
        function = get_kernel(module, names[step.kernel], device)
        if step.kernel == "prep" and prep_carveout:
            prefer_max_shared(function)
        if step.shared:
            allow_dynamic_shared(function, step.shared)
        launch(function, step.grid, step.block, params, shared_bytes=step.shared, programmatic=step.programmatic)
