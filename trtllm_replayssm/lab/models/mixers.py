"""SSM mixers of the reference decoders: Nemotron-H Mamba-2 and Qwen3.5 Gated DeltaNet.

Parameter names follow the Hugging Face checkpoints. Prefill runs a plain sequential float32 scan (or, for
training, its chunked form) and returns the final recurrent state (handed to the decode cache); decode runs one token through the shared projections/conv/norm
and calls the SSM op selected by the decoder's :class:`SSMStates` (baseline or replay); verify runs a speculative
window of tokens through the same layers (the conv and the SSM see the window without committing it).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .config import HybridConfig
from trtllm_replayssm.core.ops.conv import conv1d_update
from trtllm_replayssm.core.samples import DeltaStep, Mamba2Step
from trtllm_replayssm.lab.layers.ops import conv1d_verify

from .layers import GatedRMSNorm, PackedLinears, conv_prefill
from .ssm_state import SSMStates

# parameters kept in float32 whatever the model dtype (they enter the SSM ops as fp32)
FP32_PARAMS: frozenset[str] = frozenset({"A_log", "D", "dt_bias"})


def l2norm(x: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


def mamba2_scan(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                D: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequential Mamba-2 scan from a zero state in float32. ``x [b,T,H,P]``, ``delta [b,T,H]`` (after bias and
    softplus), ``A, D [H]``, ``B, C [b,T,G,N]``. Returns ``y [b,T,H,P]`` and the final state ``[b,H,P,N]``."""
    b, t, h, p = x.shape
    rep = h // B.shape[2]
    xf, df = x.float(), delta.float()
    Bh, Ch = B.float().repeat_interleave(rep, 2), C.float().repeat_interleave(rep, 2)
    state = x.new_zeros((b, h, p, B.shape[-1]), dtype=torch.float32)
    ys = []
    for i in range(t):
        decay = torch.exp(A.float() * df[:, i])[:, :, None, None]
        state = state * decay + (df[:, i, :, None] * xf[:, i]).unsqueeze(-1) * Bh[:, i, :, None, :]
        ys.append((state * Ch[:, i, :, None, :]).sum(-1) + D.float()[:, None] * xf[:, i])
    return torch.stack(ys, 1), state


def mamba2_chunk_scan(x: torch.Tensor, delta: torch.Tensor, A: torch.Tensor, B: torch.Tensor, C: torch.Tensor,
                      D: torch.Tensor, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`mamba2_scan` in chunks of ``chunk`` tokens (the state-space dual form, float32): within a chunk the
    outputs are one masked (C Bᵀ ∘ decay) product, across chunks the state is carried once per chunk. Same inputs and
    results up to float summation order; for training (few launches per chunk instead of per token)."""
    b, t, h, p = x.shape
    rep = h // B.shape[2]
    pad = -t % chunk
    nc = (t + pad) // chunk

    def chunks(v: torch.Tensor) -> torch.Tensor:  # [b, T, ...] -> [b, nc, chunk, ...], zero-padded
        v = F.pad(v.float(), (0, 0) * (v.dim() - 2) + (0, pad))
        return v.view(b, nc, chunk, *v.shape[2:])

    xdt = chunks(x * delta[..., None])                                     # [b, c, l, h, p]
    Bh, Ch = chunks(B.repeat_interleave(rep, 2)), chunks(C.repeat_interleave(rep, 2))  # [b, c, l, h, n]
    a = chunks(A.float() * delta.float()).permute(0, 3, 1, 2)             # [b, h, c, l]; padding: no decay
    cum = a.cumsum(-1)
    diff = cum[..., :, None] - cum[..., None, :]                           # [b, h, c, l, s]: decay s -> l
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=x.device).tril()
    decay = torch.exp(diff.masked_fill(~causal, float("-inf")))
    y = torch.einsum("bclhn,bcshn,bhcls,bcshp->bclhp", Ch, Bh, decay, xdt)
    to_end = torch.exp(cum[..., -1:] - cum)                                # [b, h, c, l]
    contrib = torch.einsum("bclhn,bhcl,bclhp->bchpn", Bh, to_end, xdt)     # each chunk's input to its end state
    state = x.new_zeros((b, h, p, B.shape[-1]), dtype=torch.float32)
    starts = []
    for c in range(nc):
        starts.append(state)
        state = state * torch.exp(cum[:, :, c, -1])[:, :, None, None] + contrib[:, c]
    y = y + torch.einsum("bclhn,bchpn,bhcl->bclhp", Ch, torch.stack(starts, 1), torch.exp(cum))
    y = y.reshape(b, nc * chunk, h, p)[:, :t] + D.float()[:, None] * x.float()
    return y, state


def gdn_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
             scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Sequential gated delta rule from a zero state in float32. ``q, k [b,T,H,K]`` (already l2-normalised),
    ``v [b,T,HV,V]``, ``g, beta [b,T,HV]``. Returns ``o [b,T,HV,V]`` and the final state ``[b,HV,V,K]``."""
    b, t, hv, vd = v.shape
    rep = hv // q.shape[2]
    qh, kh = q.float().repeat_interleave(rep, 2), k.float().repeat_interleave(rep, 2)
    state = v.new_zeros((b, hv, vd, q.shape[-1]), dtype=torch.float32)
    outs = []
    for i in range(t):
        state = state * torch.exp(g[:, i].float())[:, :, None, None]
        kv = (state * kh[:, i, :, None, :]).sum(-1)
        u = beta[:, i].float()[:, :, None] * (v[:, i].float() - kv)
        state = state + u.unsqueeze(-1) * kh[:, i, :, None, :]
        outs.append((state * (qh[:, i] * scale)[:, :, None, :]).sum(-1))
    return torch.stack(outs, 1), state


def gdn_chunk_scan(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                   scale: float, chunk: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`gdn_scan` in chunks of ``chunk`` tokens (float32). With ``γ_i`` the chunk's cumulative decay to token
    i and S0 the state at its start, the delta-rule updates solve the unit lower-triangular system
    ``(I + A) U = diag(β) (V - diag(γ) K S0ᵀ)``, ``A[i, j] = β_i γ_i / γ_j (k_i · k_j)`` (j < i); then
    ``O = diag(γ) Q S0ᵀ + (QKᵀ ∘ γ_i / γ_j)_{j <= i} U`` and ``S = γ_last S0 + Uᵀ diag(γ_last / γ) K``. Same inputs
    and results as :func:`gdn_scan` up to float rounding; for training."""
    b, t, hv, vd = v.shape
    rep = hv // q.shape[2]
    pad = -t % chunk
    nc = (t + pad) // chunk

    def chunks(x: torch.Tensor) -> torch.Tensor:  # [b, T, hv, ...] -> [b, hv, c, l, ...], zero-padded
        x = F.pad(x.float(), (0, 0) * (x.dim() - 2) + (0, pad))
        x = x.view(b, nc, chunk, *x.shape[2:])
        return x.permute(0, 3, 1, 2, *range(4, x.dim()))

    qc = chunks(q.repeat_interleave(rep, 2)) * scale  # [b, h, c, l, K]
    kc, vc = chunks(k.repeat_interleave(rep, 2)), chunks(v)
    bc, cum = chunks(beta), chunks(g).cumsum(-1)      # [b, h, c, l]; padding: β = 0, no decay
    causal = torch.ones(chunk, chunk, dtype=torch.bool, device=v.device).tril()
    ratio = torch.exp((cum[..., :, None] - cum[..., None, :]).masked_fill(~causal, float("-inf")))  # γ_i / γ_j
    strict = (bc[..., None] * ratio * (kc @ kc.transpose(-1, -2))).tril(-1)
    eye = torch.eye(chunk, device=v.device)
    w = torch.linalg.solve_triangular(eye + strict, (bc * torch.exp(cum))[..., None] * kc, upper=False,
                                      unitriangular=True)
    u0 = torch.linalg.solve_triangular(eye + strict, bc[..., None] * vc, upper=False, unitriangular=True)
    qk = (qc @ kc.transpose(-1, -2)) * ratio
    to_end = torch.exp(cum[..., -1:] - cum)
    state = v.new_zeros((b, hv, vd, q.shape[-1]), dtype=torch.float32)
    outs = []
    for c in range(nc):
        u = u0[:, :, c] - w[:, :, c] @ state.transpose(-1, -2)                       # [b, h, l, V]
        outs.append(torch.exp(cum[:, :, c])[..., None] * (qc[:, :, c] @ state.transpose(-1, -2)) + qk[:, :, c] @ u)
        state = torch.exp(cum[:, :, c, -1])[..., None, None] * state + \
            u.transpose(-1, -2) @ (to_end[:, :, c, :, None] * kc[:, :, c])
    o = torch.stack(outs, 2).reshape(b, hv, nc * chunk, vd).transpose(1, 2)[:, :t]
    return o, state


class Mamba2Mixer(nn.Module):
    """in_proj -> [z | xBC | dt]; causal conv1d + SiLU on xBC; SSM; gated RMSNorm(y, z); out_proj."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.h, self.p, self.n, self.g = cfg.mamba_heads, cfg.mamba_head_dim, cfg.d_state, cfg.n_groups
        self.dims = cfg.ssm_dims
        self.d_inner, self.conv_dim = cfg.d_inner, cfg.ssm_dims.conv_dim
        self.in_proj = nn.Linear(cfg.hidden_size, self.d_inner + self.conv_dim + self.h, bias=False)
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.conv_kernel, groups=self.conv_dim, bias=True)
        self.dt_bias = nn.Parameter(torch.zeros(self.h))
        self.A_log = nn.Parameter(torch.zeros(self.h))
        self.D = nn.Parameter(torch.ones(self.h))
        self.norm = GatedRMSNorm(self.d_inner, self.d_inner // self.g, cfg.rms_eps, norm_before_gate=False)
        self.out_proj = nn.Linear(self.d_inner, cfg.hidden_size, bias=False)
        self._A: tuple[tuple[int, int], torch.Tensor] | None = None

    def A(self) -> torch.Tensor:
        """``A = -exp(A_log)`` (float32), computed again only when ``A_log`` changed (not in every decode step);
        differentiable under autograd (training)."""
        if torch.is_grad_enabled() and self.A_log.requires_grad:
            return -torch.exp(self.A_log.float())
        key = (self.A_log.data_ptr(), self.A_log._version)
        if self._A is None or self._A[0] != key:
            self._A = (key, -torch.exp(self.A_log.detach().float()))
        return self._A[1]

    def prefill(self, hs: torch.Tensor, chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``hs [b,T,D]`` -> (output [b,T,D], conv state [b,C,K-1], SSM state [b,H,P,N] float32); ``chunk``: the
        chunked scan (training) instead of the sequential one."""
        z, xbc, dt = self.dims.split_zxbcdt(self.in_proj(hs))
        xbc, conv_state = conv_prefill(xbc, self.conv1d.weight, self.conv1d.bias)
        x, B, C = self.dims.split_xbc(F.silu(xbc))
        delta = F.softplus(dt.float() + self.dt_bias.float())
        if chunk:
            y, state = mamba2_chunk_scan(x, delta, self.A(), B, C, self.D, chunk)
        else:
            y, state = mamba2_scan(x, delta, self.A(), B, C, self.D)
        y = self.norm(y.flatten(-2).to(hs.dtype), z)
        return self.out_proj(y), conv_state, state

    def _finish(self, y: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``y [..., H, P]``, ``z [..., H * P]`` -> out_proj(gated norm(y, z))."""
        return self.out_proj(self.norm(y.flatten(-2), z))

    def decode(self, hs: torch.Tensor, conv_state: torch.Tensor, ssm: SSMStates, idx: int) -> torch.Tensor:
        """``hs [b,D]`` -> output ``[b,D]``; steps ``conv_state`` and SSM layer ``idx`` of ``ssm`` in place."""
        z, xbc, dt = self.dims.split_zxbcdt(self.in_proj(hs))
        x, B, C = self.dims.split_xbc(conv1d_update(xbc, conv_state, self.conv1d.weight, self.conv1d.bias))
        return self._finish(self.ssm_step(ssm, idx, x, dt, B, C), z)

    def verify(self, hs: torch.Tensor, conv_state: torch.Tensor, conv_window: torch.Tensor, ssm: SSMStates,
               idx: int) -> torch.Tensor:
        """A speculative window ``hs [b,T,D]`` -> ``[b,T,D]`` (:meth:`SSMStates.verify`); ``conv_state`` is read,
        the window's conv inputs go to ``conv_window [b,T,C]`` for the commit."""
        z, xbc, dt = self.dims.split_zxbcdt(self.in_proj(hs))
        conv_window.copy_(xbc)
        x, B, C = self.dims.split_xbc(conv1d_verify(xbc, conv_state, self.conv1d.weight, self.conv1d.bias, silu=True))
        return self._finish(self.ssm_step(ssm, idx, x, dt, B, C, window=True), z)

    def ssm_step(self, ssm: SSMStates, idx: int, x: torch.Tensor, dt: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, window: bool = False) -> torch.Tensor:
        """The SSM op of layer ``idx``: ``x [b,H,P]`` -> ``y [b,H,P]`` (no z gate: the gate is in the gated RMSNorm);
        ``window``: a speculative window, every per-token input with a window dim after the batch dim."""
        run = ssm.verify if window else ssm.step
        return run(idx, x.new_empty(x.shape), Mamba2Step(x, dt, self.A(), B, C, self.D, self.dt_bias))

    def probe_inputs(self, lead: tuple[int, ...], dtype: torch.dtype,
                     gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """Static random inputs ``(x, dt, B, C)`` of :meth:`ssm_step` (leading dims ``lead``: ``(b,)`` or, for a
        window, ``(b, T)``) for timing the SSM op alone."""
        dev = self.D.device
        x = torch.randn((*lead, self.h, self.p), generator=gen, device=dev).to(dtype)
        dt = torch.randn((*lead, self.h), generator=gen, device=dev).to(dtype)
        B = torch.randn((*lead, self.g, self.n), generator=gen, device=dev).to(dtype)
        C = torch.randn((*lead, self.g, self.n), generator=gen, device=dev).to(dtype)
        return x, dt, B, C


class GatedDeltaNetMixer(nn.Module):
    """in_proj_qkv -> causal conv1d + SiLU -> q, k, v; in_proj_z/b/a; gated delta rule; gated RMSNorm; out_proj."""

    def __init__(self, cfg: HybridConfig) -> None:
        super().__init__()
        self.dims = cfg.ssm_dims
        self.hk, self.hv, self.dk, self.dv = cfg.gdn_k_heads, cfg.gdn_v_heads, cfg.gdn_k_dim, cfg.gdn_v_dim
        self.value_dim, self.conv_dim = self.hv * self.dv, self.dims.conv_dim
        d = cfg.hidden_size
        self.in_proj_qkv = nn.Linear(d, self.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(d, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(d, self.hv, bias=False)
        self.in_proj_a = nn.Linear(d, self.hv, bias=False)
        self.in_proj = PackedLinears(self.in_proj_qkv, self.in_proj_z, self.in_proj_b, self.in_proj_a)  # decode
        self.conv1d = nn.Conv1d(self.conv_dim, self.conv_dim, cfg.conv_kernel, groups=self.conv_dim, bias=False)
        self.dt_bias = nn.Parameter(torch.zeros(self.hv))
        self.A_log = nn.Parameter(torch.zeros(self.hv))
        self.norm = GatedRMSNorm(self.dv, self.dv, cfg.rms_eps, norm_before_gate=True)
        self.out_proj = nn.Linear(self.value_dim, d, bias=False)

    def gates(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``g = -exp(A_log) * softplus(a + dt_bias)``, ``beta = sigmoid(b)`` (float32)."""
        g = -torch.exp(self.A_log.float()) * F.softplus(a.float() + self.dt_bias.float())
        return g, torch.sigmoid(b.float())

    def _finish(self, o: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        """``o [..., HV, V]``, ``z [..., HV * V]`` -> out_proj(norm(o) * silu(z)) (the norm per value head)."""
        return self.out_proj(self.norm(o.flatten(-2), z))

    def prefill(self, hs: torch.Tensor, chunk: int | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``hs [b,T,D]`` -> (output [b,T,D], conv state [b,C,K-1], state [b,HV,V,K] float32); ``chunk``: the
        chunked scan (training) instead of the sequential one."""
        qkv, conv_state = conv_prefill(self.in_proj_qkv(hs), self.conv1d.weight, None)
        q, k, v = self.dims.split_qkv(F.silu(qkv))
        g, beta = self.gates(self.in_proj_a(hs), self.in_proj_b(hs))
        scan = (lambda *a: gdn_chunk_scan(*a, chunk)) if chunk else gdn_scan
        o, state = scan(l2norm(q.float()), l2norm(k.float()), v, g, beta, self.dk ** -0.5)
        return self._finish(o.to(hs.dtype), self.in_proj_z(hs)), conv_state, state

    def decode(self, hs: torch.Tensor, conv_state: torch.Tensor, ssm: SSMStates, idx: int) -> torch.Tensor:
        """``hs [b,D]`` -> output ``[b,D]``; steps ``conv_state`` and SSM layer ``idx`` of ``ssm`` in place."""
        qkv, z, b, a = self.in_proj(hs)
        q, k, v = self.dims.split_qkv(conv1d_update(qkv, conv_state, self.conv1d.weight, None))
        return self._finish(self.ssm_step(ssm, idx, q, k, v, a, b), z)

    def verify(self, hs: torch.Tensor, conv_state: torch.Tensor, conv_window: torch.Tensor, ssm: SSMStates,
               idx: int) -> torch.Tensor:
        """A speculative window ``hs [b,T,D]`` -> ``[b,T,D]`` (:meth:`SSMStates.verify`); ``conv_state`` is read,
        the window's conv inputs go to ``conv_window [b,T,C]`` for the commit."""
        qkv, z, b, a = self.in_proj(hs)
        conv_window.copy_(qkv)
        q, k, v = self.dims.split_qkv(conv1d_verify(qkv, conv_state, self.conv1d.weight, None, silu=True))
        return self._finish(self.ssm_step(ssm, idx, q, k, v, a, b, window=True), z)

    def ssm_step(self, ssm: SSMStates, idx: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
                 b: torch.Tensor, window: bool = False) -> torch.Tensor:
        """The SSM op of layer ``idx``: ``q,k [b,H,K]``, ``v [b,HV,V]``, ``a,b [b,HV]`` -> ``o [b,HV,V]`` (q/k l2norm,
        gates and ``scale = K**-0.5`` inside the op); ``window``: a speculative window, every input with a window
        dim after the batch dim."""
        run = ssm.verify if window else ssm.step
        return run(idx, v.new_empty(v.shape), DeltaStep(q, k, v, a, b, self.A_log, self.dt_bias))

    def probe_inputs(self, lead: tuple[int, ...], dtype: torch.dtype,
                     gen: torch.Generator) -> tuple[torch.Tensor, ...]:
        """Static random inputs ``(q, k, v, a, b)`` of :meth:`ssm_step` (leading dims ``lead``: ``(b,)`` or, for a
        window, ``(b, T)``) for timing the SSM op alone."""
        dev = self.A_log.device

        def rnd(*shape: int) -> torch.Tensor:
            return torch.randn((*lead, *shape), generator=gen, device=dev).to(dtype)

        return rnd(self.hk, self.dk), rnd(self.hk, self.dk), rnd(self.hv, self.dv), rnd(self.hv), rnd(self.hv)
