"""One description of each SSM family: its dims, state cache, kernels, planners, ops and sample inputs. Whatever
works on every family (the benchmark, the memory plan, the serving glue, the reference decoders) looks the family up
here instead of branching on its name."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims, SSMDims
from trtllm_replayssm.core.ops import gdn, kda, mamba2, mamba2_spec, spec
from trtllm_replayssm.core.reference import gdn as ref_gdn, kda as ref_kda, mamba2 as ref_mamba2
from trtllm_replayssm.core.samples import delta_step, mamba2_step


@dataclass(frozen=True)
class Family:
    """An SSM family. ``replay_decode(layer, *step_args, ...)`` / ``state_update(state, *step_args, ...)`` are its
    ops, ``replay_plan`` / ``state_update_plan`` their planners; ``random_step(dims, batch, gen, device,
    act_dtype)`` draws one step's inputs (``.op_args()`` gives the ops' arguments); ``reference_step(state, step)``
    is the float64 recurrence of one token for a batch of rows: ``(out [b, heads, rows], new state)``.
    Speculative decoding (docs/design.md; the ops: CUDA kernels on a GPU, the float32 references on the CPU):
    ``verify_step(layer, *step_args, state_batch_indices, pad_slot_id, out, ...)`` decodes a window of T tokens
    (step arguments ``[b, T, ...]``) from checkpoint + ring, ``commit(layer, step, accepted, state_batch_indices,
    pad_slot_id, window)`` keeps each row's accepted count (``step``: the verified window's inputs, for the layer
    constants; ``accepted``: any integer tensor)."""

    name: str
    title: str
    dims: type
    replay_decode: Callable
    state_update: Callable
    replay_plan: Callable
    state_update_plan: Callable
    kernel_configs: Callable
    random_step: Callable
    reference_step: Callable
    _new_cache: Callable
    verify_step: Callable
    commit: Callable

    def new_cache(self, dims: SSMDims, num_layers: int, slots: int, buffer_len: int = 16,
                  state_dtype: str | torch.dtype = "fp32", act_dtype: torch.dtype = torch.bfloat16,
                  device: torch.device | str = "cuda", checkpoints: bool = True) -> ReplayStateCache:
        """A replay cache for ``num_layers`` layers of ``dims`` (TP-local); ``checkpoints=False``: rings, cursors
        and scratch only (the checkpoints are handed in per call, ``ReplayStateCache.with_checkpoint``)."""
        if not isinstance(dims, self.dims):
            raise TypeError(f"dims: expected {self.dims.__name__} for {self.name}, got {type(dims).__name__}")
        return self._new_cache(dims, num_layers, slots, buffer_len=buffer_len, state_dtype=state_dtype,
                               act_dtype=act_dtype, device=device, checkpoints=checkpoints)


def _commit(layer: object, _step: object, accepted: torch.Tensor, **kw) -> None:
    """Every family's speculative commit: a cursor move (``core/ops/spec.py``)."""
    spec.commit(layer, accepted.to(device=layer.cursor.device, dtype=torch.int32), **kw)


FAMILIES: dict[str, Family] = {f.name: f for f in (
    Family("mamba2", "Mamba-2", Mamba2Dims, mamba2.replay_decode, mamba2.state_update, mamba2.replay_plan,
           mamba2.state_update_plan, mamba2.kernel_configs, mamba2_step,
           lambda s, st: tuple(reversed(ref_mamba2.sequential_step(s, st.x, st.dt, st.A, st.B, st.C, st.D, None,
                                                                   st.dt_bias, True))),
           lambda d, n, s, **kw: ReplayStateCache.mamba2(n, s, d.nheads, d.head_dim, d.d_state, d.n_groups, **kw),
           mamba2_spec.verify_decode, _commit),
    Family("gdn", "Gated DeltaNet", GDNDims, gdn.replay_decode, gdn.state_update, gdn.replay_plan,
           gdn.state_update_plan, gdn.kernel_configs, delta_step,
           lambda s, st: ref_gdn.sequential_step(s, st.q, st.k, st.v, st.a, st.b, st.A_log, st.dt_bias),
           lambda d, n, s, **kw: ReplayStateCache.gdn(n, s, d.num_k_heads, d.num_v_heads, d.head_k_dim, d.head_v_dim,
                                                      **kw),
           gdn.verify_decode, _commit),
    Family("kda", "Kimi Delta Attention", KDADims, kda.replay_decode, kda.state_update, kda.replay_plan,
           kda.state_update_plan, kda.kernel_configs, delta_step,
           lambda s, st: ref_kda.sequential_step(s, st.q, st.k, st.v, st.a, st.b, st.A_log, st.dt_bias),
           lambda d, n, s, **kw: ReplayStateCache.kda(n, s, d.num_heads, d.head_dim, **kw),
           kda.verify_decode, _commit),
)}


def get_family(name: str) -> Family:
    """The family ``name`` (mamba2, gdn, kda); ValueError naming the choices otherwise."""
    try:
        return FAMILIES[name]
    except KeyError:
        raise ValueError(f"family: expected one of {list(FAMILIES)}, got {name!r}") from None


def family_of(dims: SSMDims) -> Family:
    """The family of a dims object."""
    return FAMILIES[dims.family]
