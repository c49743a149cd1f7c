"""Recurrent SSM state of a decoder's SSM layers, and the one switch between the baseline and the replay ops.

``ssm_impl="baseline"``: one plain state tensor per layer, updated by ``ops.<family>.state_update`` every step.
``ssm_impl="replay"``: a :class:`~trtllm_replayssm.core.cache.ReplayStateCache` (checkpoint + rings + cursors), stepped by
``ops.<family>.replay_decode``. Everything around the SSM op (projections, conv, norms) is shared code.
"""
from __future__ import annotations

import torch

SSM_IMPLS: tuple[str, ...] = ("baseline", "replay")
REPLAY_MODES: tuple[str, ...] = ("auto", "replay", "flush")


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")


class SSMStates:
    """The SSM state of ``num_layers`` SSM layers for ``slots`` sequences (slot ``i`` = batch row ``i``)."""

    def __init__(self, family: str, impl: str, num_layers: int, slots: int, dims: dict[str, int],
                 state_dtype: torch.dtype, act_dtype: torch.dtype, buffer_len: int, device: torch.device,
                 replay_mode: str = "auto") -> None:
        _check_choice("ssm_impl", impl, SSM_IMPLS)
        _check_choice("replay_mode", replay_mode, REPLAY_MODES)
        _check_choice("family", family, ("mamba2", "gdn"))
        if buffer_len < 1:
            raise ValueError(f"buffer_len: expected >= 1, got {buffer_len}")
        self.family, self.impl, self.replay_mode = family, impl, replay_mode
        self.num_layers, self.slots, self.buffer_len = num_layers, slots, buffer_len
        self.state_dtype, self.device = state_dtype, device
        self.slot_ids = torch.arange(slots, dtype=torch.int32, device=device)
        if family == "mamba2":
            self.state_shape = (slots, dims["nheads"], dims["head_dim"], dims["d_state"])
        else:
            self.state_shape = (slots, dims["num_v_heads"], dims["head_v_dim"], dims["head_k_dim"])
        self.cache = None
        self.states: list[torch.Tensor] = []
        if impl == "baseline":
            self.states = [torch.zeros(self.state_shape, dtype=state_dtype, device=device) for _ in range(num_layers)]
        else:
            from trtllm_replayssm.core.cache import ReplayStateCache

            factory = getattr(ReplayStateCache, family)
            self.cache = factory(num_layers=num_layers, slots=slots, buffer_len=buffer_len, state_dtype=state_dtype,
                                 act_dtype=act_dtype, device=device, **dims)

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

    def mamba2_step(self, layer: int, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, D: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
        """One Mamba-2 decode step of SSM layer ``layer``: ``x [b,H,P]`` -> ``y [b,H,P]`` (no z gate: the gate is in
        the gated RMSNorm after the op)."""
        from trtllm_replayssm.core.ops import mamba2 as ops

        out = torch.empty_like(x)
        kw = dict(D=D, z=None, dt_bias=dt_bias, dt_softplus=True, state_batch_indices=self.slot_ids, out=out)
        if self.cache is not None:
            ops.replay_decode(self.cache.layer(layer), x, dt, A, B, C, mode=self.replay_mode, **kw)
        else:
            ops.state_update(self.states[layer], x, dt, A, B, C, **kw)
        return out

    def gdn_step(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                 b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
        """One GDN decode step of SSM layer ``layer``: ``q,k [b,H,K]``, ``v [b,HV,V]``, ``a,b [b,HV]`` -> ``o [b,HV,V]``
        (q/k l2norm, gates and ``scale = K**-0.5`` inside the op)."""
        from trtllm_replayssm.core.ops import gdn as ops

        out = torch.empty_like(v)
        kw = dict(scale=None, state_batch_indices=self.slot_ids, out=out)
        if self.cache is not None:
            ops.replay_decode(self.cache.layer(layer), q, k, v, a, b, A_log, dt_bias, mode=self.replay_mode, **kw)
        else:
            ops.state_update(self.states[layer], q, k, v, a, b, A_log, dt_bias, **kw)
        return out
