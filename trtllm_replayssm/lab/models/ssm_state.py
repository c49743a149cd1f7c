"""Recurrent SSM state of a decoder's SSM layers, and the one switch between the baseline and the replay ops.

``ssm_impl="baseline"``: one plain state tensor per layer, updated by ``ops.<family>.state_update`` every step.
``ssm_impl="replay"``: a :class:`~trtllm_replayssm.core.cache.ReplayStateCache` (checkpoint + rings + cursors), stepped
by ``ops.<family>.replay_decode``. Everything around the SSM op (projections, conv, norms) is shared code.
"""
from __future__ import annotations

import torch

from trtllm_replayssm.core.dims import SSMDims
from trtllm_replayssm.core.families import family_of

SSM_IMPLS: tuple[str, ...] = ("baseline", "replay")
REPLAY_MODES: tuple[str, ...] = ("auto", "replay", "flush")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")


class SSMStates:
    """The SSM state of ``num_layers`` SSM layers of ``dims`` for ``slots`` sequences (slot ``i`` = batch row ``i``)."""

    def __init__(self, impl: str, num_layers: int, slots: int, dims: SSMDims, state_dtype: torch.dtype,
                 act_dtype: torch.dtype, buffer_len: int, device: torch.device, replay_mode: str = "auto") -> None:
        _check_choice("ssm_impl", impl, SSM_IMPLS)
        _check_choice("replay_mode", replay_mode, REPLAY_MODES)
        if buffer_len < 1:
            raise ValueError(f"buffer_len: expected >= 1, got {buffer_len}")
        self.family = family_of(dims)
        self.impl, self.replay_mode = impl, replay_mode
        self.num_layers, self.slots, self.buffer_len = num_layers, slots, buffer_len
        self.state_dtype, self.device = state_dtype, device
        self.slot_ids = torch.arange(slots, dtype=torch.int32, device=device)
        self.state_shape = (slots, dims.heads, dims.rows, dims.cols)
        self.cache = None
        self.states: list[torch.Tensor] = []
        if impl == "baseline":
            self.states = [torch.zeros(self.state_shape, dtype=state_dtype, device=device) for _ in range(num_layers)]
        else:
            self.cache = self.family.new_cache(dims, num_layers, slots, buffer_len=buffer_len,
                                               state_dtype=state_dtype, act_dtype=act_dtype, device=device)

    def reset(self) -> None:
        """Zero every state (and, for replay, the rings' cursors) in place; buffer addresses are kept."""
        if self.cache is not None:
            self.cache.reset_slots(self.slot_ids)
        for s in self.states:
            s.zero_()

    def load_prefill(self, layer: int, states: torch.Tensor) -> None:
        """Hand the prefill states ``[slots, ...]`` (float32) of SSM layer ``layer`` to the cache."""
        if tuple(states.shape) != self.state_shape:
            raise ValueError(f"states: expected shape {self.state_shape}, got {tuple(states.shape)}")
        if self.cache is not None:
            self.cache.load_prefill_state(layer, self.slot_ids, states)
        else:
            self.states[layer].copy_(states)

    def step(self, layer: int, out: torch.Tensor, args: tuple, **kwargs: object) -> torch.Tensor:
        """One decode step of SSM layer ``layer`` with the family's op: ``args`` (and ``kwargs``) are the op's step
        inputs after the state (Mamba-2 ``x, dt, A, B, C``; GDN ``q, k, v, a, b, A_log, dt_bias``); writes ``out``."""
        kw = dict(kwargs, state_batch_indices=self.slot_ids, out=out)
        if self.cache is not None:
            self.family.replay_decode(self.cache.layer(layer), *args, mode=self.replay_mode, **kw)
        else:
            self.family.state_update(self.states[layer], *args, **kw)
        return out
