"""PyTorch reference of the causal depthwise conv1d decode step (``ops.conv``): its CPU path and what its CUDA kernel
is tested against. Math in float32."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def conv1d_update_(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                   silu: bool, state_indices: torch.Tensor | None = None, pad_slot_id: int = -1,
                   round_once: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of a causal depthwise conv: ``x [b, C]``, ``conv_state [slots, C, W-1]`` (the last W-1 inputs of each
    slot, oldest first, shifted in place), ``weight [C, 1, W]`` or ``[C, W]``; row b's state is the slot
    ``state_indices[b]`` (None: slot b), and a row whose id is ``pad_slot_id`` is left out. Returns (the rows computed,
    ``[n, C]``: the conv + bias, then SiLU if ``silu``, rounded to ``x.dtype`` before the SiLU, or only at the end with
    ``round_once``; their row indices ``[n]``)."""
    rows = torch.arange(x.shape[0], device=x.device)
    slots = rows if state_indices is None else state_indices.long()
    live = slots != pad_slot_id
    rows, slots = rows[live], slots[live]
    window = torch.cat([conv_state[slots], x[rows].unsqueeze(-1).to(conv_state.dtype)], dim=-1)
    y = (window.float() * weight.reshape(weight.shape[0], -1).float()).sum(-1)
    if bias is not None:
        y = y + bias.float()
    conv_state[slots] = window[:, :, 1:]
    if round_once:
        return (y / (1 + torch.exp(-y)) if silu else y).to(x.dtype), rows
    y = y.to(x.dtype)
    return F.silu(y) if silu else y, rows
