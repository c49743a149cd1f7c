"""PyTorch references of the fused decoder layers (``ops.layers``): the CPU path of those ops and what their CUDA
kernels are tested against. Math in float32, rounded to the activation dtype where noted."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_replayssm.core.checks import capturing


def rms_norm(h: torch.Tensor, weight: torch.Tensor, eps: float, unit_offset: bool) -> torch.Tensor:
    """``h * rsqrt(mean(h^2) + eps) * w`` over the last dim, ``w = 1 + weight`` with ``unit_offset``."""
    hf = h.float()
    y = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    w = weight.float() + 1.0 if unit_offset else weight.float()
    return (y * w).to(h.dtype)


def add_rms_norm_(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float,
                  unit_offset: bool) -> torch.Tensor:
    """``residual += x`` (in the activation dtype, in place), then :func:`rms_norm` of the sum."""
    residual.add_(x)
    return rms_norm(residual, weight, eps, unit_offset)


def gated_rms_norm(x: torch.Tensor, z: torch.Tensor, weight: torch.Tensor, group_size: int, eps: float,
                   norm_before_gate: bool) -> torch.Tensor:
    """RMSNorm over groups of ``group_size`` channels of the last dim with a SiLU gate ``z``:
    ``norm(x * silu(z)) * w`` or, with ``norm_before_gate``, ``norm(x) * w * silu(z)``; ``weight`` repeats along
    the last dim."""
    xf, zf = x.float(), z.float()
    if not norm_before_gate:
        xf = xf * F.silu(zf)
    g = xf.unflatten(-1, (-1, group_size))
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    y = g.flatten(-2) * weight.float().repeat(x.shape[-1] // weight.shape[0])
    if norm_before_gate:
        y = y * F.silu(zf)
    return y.to(x.dtype)


def conv1d_verify(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                  silu: bool) -> torch.Tensor:
    """A speculative window of a causal depthwise conv: ``x [b, T, C]`` (the window's tokens), ``conv_state
    [b, C, W-1]`` (not written: :func:`conv1d_commit_` keeps the accepted prefix). Returns ``[b, T, C]``, token t's
    conv over the committed inputs and the window's tokens up to t, as :func:`trtllm_replayssm.core.reference.conv.conv1d_update_` would give them."""
    width = weight.shape[-1]
    inputs = torch.cat([conv_state, x.transpose(1, 2).to(conv_state.dtype)], dim=-1)             # [b, C, W-1+T]
    windows = inputs.unfold(-1, width, 1)                                                        # [b, C, T, W]
    y = (windows.float() * weight.reshape(weight.shape[0], 1, -1).float()).sum(-1).transpose(1, 2).contiguous()
    if bias is not None:
        y = y + bias.float()
    y = y.to(x.dtype)
    return F.silu(y) if silu else y


def conv1d_commit_(conv_state: torch.Tensor, x: torch.Tensor, accepted: torch.Tensor) -> None:
    """After a verify of ``x [b, T, C]``: each row's conv state becomes the last W-1 inputs up to its accepted count
    (``accepted [b]``, 1 .. T), in place; the rejected tokens leave no trace. The counts are checked outside CUDA
    graph capture (a check reads them on the host)."""
    keep = conv_state.shape[-1]
    inputs = torch.cat([conv_state, x.transpose(1, 2).to(conv_state.dtype)], dim=-1)             # [b, C, W-1+T]
    a = accepted.to(torch.long)
    if not capturing() and ((a < 1) | (a > x.shape[1])).any():
        raise ValueError(f"accepted: expected 1..{x.shape[1]} per row, got {accepted.tolist()}")
    cols = (a[:, None] + torch.arange(keep, device=a.device)[None, :])[:, None, :]              # [b, 1, W-1]
    conv_state.copy_(inputs.gather(-1, cols.expand(-1, inputs.shape[1], -1)))


def mlp_act(a: torch.Tensor, b: torch.Tensor | None, kind: str) -> torch.Tensor:
    """``relu2``: ``relu(a)^2``; ``swiglu``: ``silu(a) * b``."""
    if kind == "relu2":
        return torch.relu(a).square()
    if kind == "swiglu":
        return F.silu(a) * b
    raise ValueError(f"kind: expected 'relu2' or 'swiglu', got {kind!r}")


def rope(x: torch.Tensor, pos: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """Rotate-half RoPE on the first ``rotary_dim`` channels of ``x [..., heads, hd]``; ``pos`` broadcasts to
    ``x.shape[:-2]``."""
    if rotary_dim == 0:
        return x.clone()
    half = rotary_dim // 2
    inv = theta ** (-torch.arange(0, half, device=x.device, dtype=torch.float32) / half)
    ang = pos.float().unsqueeze(-1) * inv  # [..., half]
    cos, sin = ang.cos().unsqueeze(-2), ang.sin().unsqueeze(-2)
    xr = x[..., :rotary_dim].float()
    x1, x2 = xr[..., :half], xr[..., half:]
    rot = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return torch.cat([rot.to(x.dtype), x[..., rotary_dim:]], dim=-1)


def attention_decode_(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None,
                      k_cache: torch.Tensor, v_cache: torch.Tensor, pos: torch.Tensor, scale: float,
                      window: int = 0) -> torch.Tensor:
    """Single-token GQA attention over a static KV cache: writes ``k, v [b, kv, hd]`` at position ``pos [b]`` of
    ``k_cache, v_cache [b, kv, max_len, hd]``, attends ``q [b, heads, hd]`` over positions ``0..pos`` (matmuls in the
    cache dtype with fp32 accumulation, softmax in fp32), gates by ``sigmoid(gate [b, heads, hd])`` if given.
    ``window`` > 0: over positions ``pos - window + 1 .. pos`` of a ring cache (position p in slot ``p % max_len``).
    Returns ``[b, heads * hd]``."""
    b, heads, hd = q.shape
    kv_heads, slots = k.shape[1], k_cache.shape[2]
    rows = torch.arange(b, device=q.device)[:, None]
    slot = pos % slots if window else pos
    k_cache.index_put_((rows, torch.arange(kv_heads, device=q.device)[None, :], slot[:, None]), k)
    v_cache.index_put_((rows, torch.arange(kv_heads, device=q.device)[None, :], slot[:, None]), v)
    qg = q.reshape(b, kv_heads, heads // kv_heads, hd)
    scores = torch.matmul(qg, k_cache.transpose(-1, -2)).float() * scale  # [b, kv, rep, max_len]
    cols = torch.arange(slots, device=q.device).unsqueeze(0)
    if window:  # the slot's latest position: pos - age, attended when 0 <= age < window and age <= pos
        age = (pos.unsqueeze(1) - cols) % slots
        valid = (age < window) & (age <= pos.unsqueeze(1))
    else:
        valid = cols <= pos.unsqueeze(1)  # [b, max_len]
    scores = scores.masked_fill(~valid[:, None, None, :], float("-inf"))
    o = torch.matmul(scores.softmax(-1).to(v_cache.dtype), v_cache).reshape(b, heads, hd)
    if gate is not None:
        o = o * torch.sigmoid(gate)
    return o.reshape(b, heads * hd)
