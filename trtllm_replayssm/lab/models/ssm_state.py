"""Recurrent SSM state of a decoder's SSM layers, and the one switch between the baseline and the replay ops.

``ssm_impl="baseline"``: one plain state tensor per layer, updated by ``ops.<family>.state_update`` every step.
``ssm_impl="replay"``: a :class:`~trtllm_replayssm.core.cache.ReplayStateCache` (checkpoint + rings + cursors), stepped
by ``ops.<family>.replay_decode``. Everything around the SSM op (projections, conv, norms) is shared code.

Speculative windows (``spec_tokens`` = T > 1): :meth:`SSMStates.verify` decodes T tokens per row without committing
them, :meth:`SSMStates.commit` keeps each row's accepted count. Replay verifies from checkpoint + ring with the
family's float32 reference and commits by a cursor move (docs/algorithm.md, speculative verify); baseline is the
per-draft-state path: each window token's state is written to a draft buffer and the accepted one is copied back.
"""
from __future__ import annotations

import torch

from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.checks import capturing
from trtllm_replayssm.core.dims import SSMDims
from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.limits import MODES
from trtllm_replayssm.core.samples import DeltaStep, Mamba2Step, window_token

SSM_IMPLS: tuple[str, ...] = ("baseline", "replay")
PAD_SLOT_ID = -1  # no row of a decoder batch pads: slot i is row i


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ValueError(f"{name}: expected one of {choices}, got {value!r}")


class SSMStates:
    """The SSM state of ``num_layers`` SSM layers of ``dims`` for ``slots`` sequences (slot ``i`` = batch row ``i``)."""

    def __init__(self, impl: str, num_layers: int, slots: int, dims: SSMDims, state_dtype: torch.dtype,
                 act_dtype: torch.dtype, buffer_len: int, device: torch.device, replay_mode: str = "auto",
                 spec_tokens: int = 1) -> None:
        _check_choice("ssm_impl", impl, SSM_IMPLS)
        _check_choice("replay_mode", replay_mode, MODES)
        if buffer_len < 1:
            raise ValueError(f"buffer_len: expected >= 1, got {buffer_len}")
        if spec_tokens < 1 or (impl == "replay" and spec_tokens > buffer_len):
            raise ValueError(f"spec_tokens: expected a window of 1 to buffer_len = {buffer_len} tokens (it must fit "
                             f"the ring), got {spec_tokens}")
        ring_len = buffer_len if spec_tokens == 1 else spec_cursor.ring_len(buffer_len, spec_tokens)
        self.family = family_of(dims)
        self.impl, self.replay_mode = impl, replay_mode
        self.num_layers, self.slots, self.buffer_len = num_layers, slots, buffer_len
        self.state_dtype, self.device = state_dtype, device
        self.spec_tokens = spec_tokens
        self.slot_ids = torch.arange(slots, dtype=torch.int32, device=device)
        self.state_shape = (slots, dims.heads, dims.rows, dims.cols)
        self.cache = None
        self.states: list[torch.Tensor] = []
        self.drafts: list[torch.Tensor] = []  # per-draft verify: [T, slots, ...] per layer
        self._windows: list[Mamba2Step | DeltaStep | None] = [None] * num_layers  # verified, not yet committed
        if impl == "baseline":
            self.states = [torch.zeros(self.state_shape, dtype=state_dtype, device=device) for _ in range(num_layers)]
            if spec_tokens > 1:
                self.drafts = [torch.zeros((spec_tokens, *self.state_shape), dtype=state_dtype, device=device)
                               for _ in range(num_layers)]
        else:
            self.cache = self.family.new_cache(dims, num_layers, slots, buffer_len=ring_len,
                                               state_dtype=state_dtype, act_dtype=act_dtype, device=device)

    def reset(self) -> None:
        """Zero every state (and, for replay, the rings' cursors) in place; buffer addresses are kept. A verified
        window not committed yet is dropped."""
        if self.cache is not None:
            self.cache.reset_slots(self.slot_ids)
        for s in self.states:
            s.zero_()
        self._windows = [None] * self.num_layers

    def load_prefill(self, layer: int, states: torch.Tensor) -> None:
        """Hand the prefill states ``[slots, ...]`` (float32) of SSM layer ``layer`` to the cache."""
        if tuple(states.shape) != self.state_shape:
            raise ValueError(f"states: expected shape {self.state_shape}, got {tuple(states.shape)}")
        if self.cache is not None:
            self.cache.load_prefill_state(layer, self.slot_ids, states)
        else:
            self.states[layer].copy_(states)

    def step(self, layer: int, out: torch.Tensor, inputs: Mamba2Step | DeltaStep) -> torch.Tensor:
        """One decode step of SSM layer ``layer`` with the family's op on ``inputs`` (``[b, ...]``); writes
        ``out``."""
        if self.cache is not None:
            args, kw = inputs.op_args()
            self.family.replay_decode(self.cache.layer(layer), *args, mode=self.replay_mode,
                                      state_batch_indices=self.slot_ids, out=out, **kw)
        else:
            self._update(self.states[layer], out, inputs)
        return out

    def verify(self, layer: int, out: torch.Tensor, inputs: Mamba2Step | DeltaStep) -> torch.Tensor:
        """A speculative window of SSM layer ``layer``: per-token ``inputs`` ``[b, T, ...]`` (T = ``spec_tokens``),
        ``out [b, T, heads, rows]`` gets every token's output from the committed state and the window's earlier
        tokens. Nothing is committed until :meth:`commit`: replay writes the window's ring records past the cursors
        and no state; baseline writes each token's state to its draft buffer."""
        args, kw = inputs.op_args()
        if self.spec_tokens == 1 or args[0].dim() != 4 or args[0].shape[1] != self.spec_tokens:
            raise ValueError(f"inputs: expected a window of spec_tokens = {self.spec_tokens} tokens [b, T, ...] "
                             f"(allocate with spec_tokens >= 2), got shape {tuple(args[0].shape)}")
        if self.cache is not None:
            self.family.verify_step(self.cache.layer(layer), *args, state_batch_indices=self.slot_ids,
                                    pad_slot_id=PAD_SLOT_ID, out=out, **kw)
        else:
            self._verify_per_draft(layer, out, inputs)
        self._windows[layer] = inputs
        return out

    def commit(self, layer: int, accepted: torch.Tensor) -> None:
        """After :meth:`verify`: each row keeps its first ``accepted[b]`` window tokens (``[b]``, 1 .. T). Replay
        moves the cursors (a later verify folds the history into the checkpoint when the ring would overrun);
        baseline copies each row's accepted draft state into the state."""
        window = self._windows[layer]
        if window is None:
            raise ValueError(f"layer: SSM layer {layer} has no verified window to commit")
        if self.cache is not None:
            self.family.commit(self.cache.layer(layer), window, accepted, state_batch_indices=self.slot_ids,
                               pad_slot_id=PAD_SLOT_ID, window=self.spec_tokens)
        else:
            self._commit_per_draft(layer, accepted)
        self._windows[layer] = None

    def _update(self, state: torch.Tensor, out: torch.Tensor, inputs: Mamba2Step | DeltaStep) -> None:
        """The baseline op on the slot pool ``state`` (read, update, write)."""
        args, kw = inputs.op_args()
        self.family.state_update(state, *args, state_batch_indices=self.slot_ids, out=out, **kw)

    def _verify_per_draft(self, layer: int, out: torch.Tensor, inputs: Mamba2Step | DeltaStep) -> None:
        """Draft ``t``'s state: the previous one (the committed state for ``t = 0``) stepped by window token ``t``."""
        drafts = self.drafts[layer]
        for t in range(self.spec_tokens):
            drafts[t].copy_(self.states[layer] if t == 0 else drafts[t - 1])
            out_t = out.new_empty((out.shape[0], *out.shape[2:]))
            self._update(drafts[t], out_t, window_token(inputs, t))
            out[:, t] = out_t

    def _commit_per_draft(self, layer: int, accepted: torch.Tensor) -> None:
        """Row ``b``'s state <- its draft ``accepted[b] - 1`` (the counts checked outside CUDA graph capture)."""
        if not capturing() and ((accepted < 1) | (accepted > self.spec_tokens)).any():
            raise ValueError(f"accepted: expected 1..{self.spec_tokens} per row, got {accepted.tolist()}")
        rows = self.slot_ids.long()
        self.states[layer].copy_(self.drafts[layer][accepted.long().to(rows.device) - 1, rows])
