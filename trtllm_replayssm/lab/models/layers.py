"""Building blocks shared by the reference decoders: norms, MLPs, causal conv1d, attention with a static KV cache."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from trtllm_replayssm.core.limits import MAX_WINDOW
from trtllm_replayssm.lab.layers import ops as fused


class PackedLinears(nn.Module):
    """Bias-free linears over the same input whose weights are rows of one packed ``[sum(out), in]`` tensor: one GEMM
    for all of them (:meth:`forward` returns the outputs side by side). The linears keep their names and parameters
    (checkpoints load by name); :meth:`pack_` makes their weights views of the packed tensor, so a copy into a weight
    writes it. A forward after anything replaced a weight's storage (a dtype cast) packs again."""

    def __init__(self, *linears: nn.Linear) -> None:
        super().__init__()
        self._linears = linears  # a tuple: registered where they are owned, not here
        self.packed: torch.Tensor | None = None

    @property
    def sizes(self) -> list[int]:
        return [lin.out_features for lin in self._linears]

    @torch.no_grad()
    def pack_(self) -> None:
        packed = torch.cat([lin.weight.data for lin in self._linears], 0)
        row = 0
        for lin in self._linears:
            lin.weight.data = packed[row:row + lin.out_features]
            row += lin.out_features
        self.packed = packed

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        if torch.is_grad_enabled() and self._linears[0].weight.requires_grad:  # training: through the parameters
            return [lin(x) for lin in self._linears]
        if self.packed is None or self._linears[0].weight.data_ptr() != self.packed.data_ptr():
            self.pack_()  # first call, or a weight's storage was replaced (e.g. a cast)
        return list(F.linear(x, self.packed).split(self.sizes, dim=-1))


class RMSNorm(nn.Module):
    """RMSNorm; ``unit_offset`` scales by ``1 + weight`` (Qwen3.5 / Gemma style, weight initialised to 0)."""

    def __init__(self, dim: int, eps: float, unit_offset: bool = False) -> None:
        super().__init__()
        self.eps = eps
        self.unit_offset = unit_offset
        self.weight = nn.Parameter(torch.zeros(dim) if unit_offset else torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return fused.rms_norm(x, self.weight, self.eps, self.unit_offset)

    def add_forward(self, x: torch.Tensor, residual: torch.Tensor) -> torch.Tensor:
        """``residual += x`` in place (the residual stream), then the norm of the sum (one fused launch on CUDA)."""
        return fused.rms_norm(x, self.weight, self.eps, self.unit_offset, residual=residual)


class GatedRMSNorm(nn.Module):
    """RMSNorm over groups of ``group_size`` channels with a SiLU gate ``z``; the ``dim`` weights repeat along wider
    inputs (Qwen3.5: one per-head weight for all value heads).

    ``norm_before_gate=False`` (Mamba-2 / Nemotron-H): ``norm(x * silu(z)) * w``;
    ``True`` (Qwen3.5 GDN): ``norm(x) * w * silu(z)``.
    """

    def __init__(self, dim: int, group_size: int, eps: float, norm_before_gate: bool) -> None:
        super().__init__()
        if dim % group_size:
            raise ValueError(f"group_size: expected a divisor of dim={dim}, got {group_size}")
        self.group_size = group_size
        self.eps = eps
        self.norm_before_gate = norm_before_gate
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return fused.gated_rms_norm(x, z, self.weight, self.group_size, self.eps, self.norm_before_gate)


class ReluSqMLP(nn.Module):
    """Nemotron-H MLP: ``down(relu(up(x))^2)``."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(fused.mlp_act(self.up_proj(x), None, "relu2"))


class SwiGLUMLP(nn.Module):
    """Qwen MLP: ``down(silu(gate(x)) * up(x))`` (gate and up in one GEMM)."""

    def __init__(self, hidden: int, inter: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)
        self.gate_up = PackedLinears(self.gate_proj, self.up_proj)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(x)
        return self.down_proj(fused.mlp_act(gate, up, "swiglu"))


class DenseExpertMoE(nn.Module):
    """A MoE layer run as one dense expert of the same per-token width (routed top-k width plus shared expert),
    optionally inside a latent down/up projection (LatentMoE). Not loadable from a routed checkpoint."""

    def __init__(self, hidden: int, width: int, shared: int, latent: int, act: str) -> None:
        super().__init__()
        inner = latent or hidden
        self.latent_in = nn.Linear(hidden, latent, bias=False) if latent else None
        self.latent_out = nn.Linear(latent, hidden, bias=False) if latent else None
        self.expert = ReluSqMLP(inner, width) if act == "relu2" else SwiGLUMLP(inner, width)
        self.shared = (ReluSqMLP(hidden, shared) if act == "relu2" else SwiGLUMLP(hidden, shared)) if shared else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.latent_in is not None:
            y = self.latent_out(self.expert(self.latent_in(x)))
        else:
            y = self.expert(x)
        return y + self.shared(x) if self.shared is not None else y


# ---------------------------------------------------------------------- causal depthwise conv1d
def conv_prefill(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise conv of ``x [b, T, C]`` with ``weight [C, 1, K]``; returns (pre-activation output [b,T,C],
    conv state [b, C, K-1] = the last K-1 inputs, zero-padded on the left)."""
    k = weight.shape[-1]
    xt = x.transpose(1, 2)
    padded = F.pad(xt, (k - 1, 0))
    y = F.conv1d(padded, weight.to(x.dtype), None if bias is None else bias.to(x.dtype), groups=x.shape[-1])
    return y.transpose(1, 2), padded[:, :, padded.shape[-1] - (k - 1):].contiguous()


# ---------------------------------------------------------------------- attention
@dataclass
class KVCache:
    """Static KV cache of one attention layer: ``k, v [b, kv_heads, slots, head_dim]`` (per-head rows dense, so
    the decode matmuls read them in place), ``pos [b]`` (int64, the number of cached tokens, advanced in place on
    the device). Full attention: position p in slot p (slots = max_len); a sliding window of W tokens: a ring of
    W + MAX_WINDOW - 1 slots (position p in slot p % slots), so that a speculative window's rejected tokens never
    overwrite a position the next window attends to."""

    k: torch.Tensor
    v: torch.Tensor
    pos: torch.Tensor

    @classmethod
    def allocate(cls, batch: int, max_len: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, window: int = 0) -> "KVCache":
        slots = min(max_len, window + MAX_WINDOW - 1) if window else max_len
        shape = (batch, kv_heads, slots, head_dim)
        return cls(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device),
                   torch.zeros(batch, dtype=torch.long, device=device))

    def reset(self) -> None:
        self.k.zero_()
        self.v.zero_()
        self.pos.zero_()


class Attention(nn.Module):
    """GQA attention with a static KV cache. Nemotron-H: no RoPE, no norms. Qwen3.5: per-head q/k RMSNorm
    (1+w), partial RoPE and a sigmoid output gate packed with q in ``q_proj``. ``window`` > 0: each query attends to
    the last ``window`` tokens, itself included (0: every earlier token)."""

    def __init__(self, hidden: int, heads: int, kv_heads: int, head_dim: int, *, qwen: bool, rotary_dim: int,
                 rope_theta: float, eps: float, window: int = 0) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim, self.window = heads, kv_heads, head_dim, window
        self.qwen, self.rotary_dim, self.rope_theta = qwen, rotary_dim, rope_theta
        self.q_proj = nn.Linear(hidden, heads * head_dim * (2 if qwen else 1), bias=False)
        self.k_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.v_proj = nn.Linear(hidden, kv_heads * head_dim, bias=False)
        self.o_proj = nn.Linear(heads * head_dim, hidden, bias=False)
        self.qkv_proj = PackedLinears(self.q_proj, self.k_proj, self.v_proj)
        if qwen:
            self.q_norm = RMSNorm(head_dim, eps, unit_offset=True)
            self.k_norm = RMSNorm(head_dim, eps, unit_offset=True)

    def _qkv(self, h: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, ...]:
        lead = h.shape[:-1]
        q, k, v = self.qkv_proj(h)
        gate = None
        if self.qwen:  # gate: [..., heads, hd]
            q, gate = q.view(*lead, self.heads, 2 * self.head_dim).chunk(2, dim=-1)
        q = q.reshape(*lead, self.heads, self.head_dim)
        k = k.view(*lead, self.kv_heads, self.head_dim)
        v = v.view(*lead, self.kv_heads, self.head_dim)
        if self.qwen:
            q, k = self.q_norm(q), self.k_norm(k)
            if self.rotary_dim:
                q = fused.rope(q, pos, self.rotary_dim, self.rope_theta)
                k = fused.rope(k, pos, self.rotary_dim, self.rope_theta)
        return q, k, v, gate

    def _out(self, o: torch.Tensor, gate: torch.Tensor | None) -> torch.Tensor:
        if gate is not None:
            o = o * torch.sigmoid(gate.flatten(-2))
        return self.o_proj(o)

    def prefill(self, h: torch.Tensor, kv: KVCache | None) -> torch.Tensor:
        """``h [b, T, D]`` from position 0: causal attention (within the window); given ``kv``, caches the
        positions it keeps (all T, or the ring's last slots) and sets ``pos = T`` (None: training, no cache)."""
        b, t, _ = h.shape
        pos = torch.arange(t, device=h.device).expand(b, t)
        q, k, v, gate = self._qkv(h, pos)
        if kv is not None:
            slots = kv.k.shape[2]
            kept = torch.arange(max(0, t - slots), t, device=h.device)
            kv.k[:, :, kept % slots] = k[:, kept].transpose(1, 2)
            kv.v[:, :, kept % slots] = v[:, kept].transpose(1, 2)
            kv.pos.fill_(t)
        rep = self.heads // self.kv_heads
        mask = None
        if self.window and t > self.window:  # query i sees keys i - window + 1 .. i
            i = torch.arange(t, device=h.device)
            mask = (i[None, :] <= i[:, None]) & (i[:, None] - i[None, :] < self.window)
        o = F.scaled_dot_product_attention(q.transpose(1, 2).float(),
                                           k.transpose(1, 2).repeat_interleave(rep, 1).float(),
                                           v.transpose(1, 2).repeat_interleave(rep, 1).float(), attn_mask=mask,
                                           is_causal=mask is None)
        return self._out(o.transpose(1, 2).reshape(b, t, -1).to(h.dtype), gate)

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gate: torch.Tensor | None, kv: KVCache,
                pos: torch.Tensor) -> torch.Tensor:
        """One token per row at positions ``pos [b]``: written to the cache there, attending over ``0..pos`` (within
        the window; a cache of fewer slots than the window never drops a position, so it is attended whole)."""
        window = min(self.window, kv.k.shape[2])
        return fused.attention_decode(q, k, v, kv.k, kv.v, pos, self.head_dim ** -0.5, gate, window)

    def decode(self, h: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """``h [b, D]``: writes this token at ``pos``, attends over the cache, ``pos += 1`` (all on the device)."""
        q, k, v, gate = self._qkv(h, kv.pos)
        o = self._attend(q, k, v, gate, kv, kv.pos)
        kv.pos.add_(1)
        return self.o_proj(o)

    def verify(self, h: torch.Tensor, kv: KVCache) -> torch.Tensor:
        """A speculative window ``h [b, T, D]`` after the ``pos`` cached tokens: token t goes to position
        ``pos + t`` and attends causally over ``0..pos+t``. ``pos`` stays (the commit adds the accepted count), so
        the entries of rejected tokens lie past it and the next window overwrites them."""
        q, k, v, gate = self._qkv(h, kv.pos[:, None] + torch.arange(h.shape[1], device=h.device))
        window = min(self.window, kv.k.shape[2])
        return self.o_proj(fused.attention_verify(q, k, v, kv.k, kv.v, kv.pos, self.head_dim ** -0.5, gate, window))
