"""Gated DeltaNet decode references: float64 sequential recurrence (ground truth) and the float32 ReplaySSM step.

State layout ``[.., HV, V, K]`` (K contiguous); value head ``i`` uses key head ``i // (HV // H)``.
Per token: ``g = -exp(A_log) * softplus(a + dt_bias)``, ``alpha = e^g``, ``beta = sigmoid(b)``,
``u = beta (v - alpha S k)``, ``S <- alpha S + u k^T``, ``o = S (scale q)`` with q, k l2-normalised.

The delta-rule core below is written for a log-gate that broadcasts over the key channels: ``[.., 1]`` here (one scalar
per value head) and ``[.., K]`` in KDA (``kda.py`` reuses it). The float32 functions work in place on the cache tensors
of the op contract (docs/design.md) and are the CPU fallback of the ops.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

from trtllm_replayssm.core import checks, spec_cursor
from trtllm_replayssm.core.checkpoint import Checkpoint, as_checkpoint
from trtllm_replayssm.core.layouts import key_ring_dtype

FLOAT_DTYPES = checks.FLOAT_DTYPES
# Per-token log-gates are clamped to this floor in the float32 paths. e^-128 is 0 in float32 (the smallest subnormal
# is e^-103.3), so no decay factor changes, but the cumulative gate stays finite (no -inf - -inf = NaN) and keeps its
# precision when a gate input saturates.
LOG_GATE_FLOOR = -128.0
L2_EPS = 1e-6
# KDA key ring form (pre-decayed keys): entry j holds ``e^{-G_j} k_j`` when its cumulative log-gate ``G_j >= -64`` on
# every channel, else the raw key ``k_j``. A step decays a pre-decayed entry by ``e^G`` (G <= G_j): ``e^{-G_j} <= e^64``
# fits float32 and bfloat16, and where ``e^G`` flushes to zero (G < -87.3) the lost factor ``e^{G - G_j}`` is below
# e^-23. ``G_j`` falls with j, so a ring whose last entry is pre-decayed holds only pre-decayed entries and a step reads
# no gate but ``G_{w-1}``; any gate, however small, stays exact (the raw form). Mirrors plugins/delta_rule_decode.cu.
PREDECAY_FLOOR = 64.0


# --------------------------------------------------------------------------------------------------- validation helpers
# Reference inputs may be strided: same checks as the ops, without the contiguity requirement.
check_tensor = functools.partial(checks.check_tensor, inner_contiguous=0)


def check_rank(name: str, t: object, ndim: int) -> torch.Tensor:
    """Return ``t`` if it is a tensor of rank ``ndim``; raise TypeError/ValueError naming ``name`` otherwise."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    return t


def check_state_io(state: object, state_batch_indices: object, out: object, batch: int, v_heads: int, dim_v: int,
                   dim_k: int, device: torch.device) -> int:
    """Check the slot pool ``state`` [slots, HV, V, K] (or a Checkpoint of that shape), the row slot ids and ``out``;
    return the slot count."""
    if isinstance(state, Checkpoint):
        slots = state.shape[0]
        if state.shape != (slots, v_heads, dim_v, dim_k) or state.device != device:
            raise ValueError(f"state: expected a checkpoint of shape {(slots, v_heads, dim_v, dim_k)} on {device}, "
                             f"got {state.shape} on {state.device}")
    else:
        slots = check_rank("state", state, 4).shape[0]
        check_tensor("state", state, (slots, v_heads, dim_v, dim_k), FLOAT_DTYPES, device)
    check_tensor("state_batch_indices", state_batch_indices, (batch,), (torch.int32,), device)
    check_tensor("out", out, (batch, v_heads, dim_v), FLOAT_DTYPES, device)
    return slots


def resolve_scale(scale: float | None, head_dim: int) -> float:
    """``scale`` as a float, defaulting to ``head_dim ** -0.5``."""
    if scale is None:
        return head_dim**-0.5
    if isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale: expected a float or None, got {type(scale).__name__}")
    return float(scale)


def check_qkv(q: object, k: object, v: object) -> tuple[int, int, int, int, int]:
    """q, k [b, H, K] and v [b, HV, V] of one dtype, HV a positive multiple of H; return (b, H, HV, K, V)."""
    batch, heads, dim_k = check_rank("q", q, 3).shape
    dev = q.device
    check_tensor("q", q, q.shape, FLOAT_DTYPES, dev)
    check_tensor("k", k, q.shape, (q.dtype,), dev)
    _, v_heads, dim_v = check_rank("v", v, 3).shape
    if heads < 1 or v_heads % heads != 0:
        raise ValueError(f"v: expected value heads to be a multiple of the key heads ({heads}), got {v_heads}")
    check_tensor("v", v, (batch, v_heads, dim_v), (q.dtype,), dev)
    return batch, heads, v_heads, dim_k, dim_v


def check_scalars(pad_slot_id: object, force_flush: object | None = None) -> None:
    """``pad_slot_id`` must be an int and ``force_flush`` (when given) a bool."""
    checks.check_int("pad_slot_id", pad_slot_id)
    if force_flush is not None and not isinstance(force_flush, bool):
        raise TypeError(f"force_flush: expected a bool, got {type(force_flush).__name__}")


def active_rows(
    state_batch_indices: torch.Tensor, pad_slot_id: int, num_slots: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch rows whose slot is not ``pad_slot_id`` and their slots (int64); slots must be in range and distinct."""
    checks.check_slot_values("state_batch_indices", state_batch_indices, num_slots, pad_slot_id)
    idx = state_batch_indices.long()
    rows = torch.nonzero(idx != pad_slot_id).squeeze(1)
    return rows, idx[rows]


def l2_normalize(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dimension."""
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) + eps)


# ------------------------------------------------------------------------------------------------------ delta-rule core
def _matvec(s: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """``S x`` for S ``[.., V, K]`` and x ``[.., K]``."""
    return (s @ x.unsqueeze(-1)).squeeze(-1)


def _expand_heads(x: torch.Tensor, num_v_heads: int, dim: int = 1) -> torch.Tensor:
    """Repeat key-head tensors along ``dim`` so value head ``i`` sees key head ``i // (HV // H)``."""
    return x.repeat_interleave(num_v_heads // x.shape[dim], dim=dim)


def _inputs(
    q: torch.Tensor, k: torch.Tensor, scale: float, num_v_heads: int, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(scaled normalised q per value head, normalised k per key head, normalised k per value head) in ``dtype``."""
    k_hat = l2_normalize(k.to(dtype))
    q_v = _expand_heads(l2_normalize(q.to(dtype)) * scale, num_v_heads)
    return q_v, k_hat, _expand_heads(k_hat, num_v_heads)


def delta_rule_sequential_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gate: torch.Tensor, beta: torch.Tensor,
    scale: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """One float64 token of the gated delta rule for a batch of rows: returns ``(out [b,HV,V], new state)``.

    ``state [b,HV,V,K]``, ``q, k [b,H,K]``, ``v [b,HV,V]``, ``log_gate [b,HV,C]`` (C = 1 or K, decay
    ``S Diag(e^g)``), ``beta [b,HV]`` (after the sigmoid).
    """
    f64 = torch.float64
    q_v, _, k_v = _inputs(q, k, scale, v.shape[1], f64)
    s = state.to(f64) * torch.exp(log_gate.to(f64)).unsqueeze(-2)
    u = beta.to(f64).unsqueeze(-1) * (v.to(f64) - _matvec(s, k_v))
    s = s + u.unsqueeze(-1) * k_v.unsqueeze(-2)
    return _matvec(s, q_v), s


def _fold(
    s_h: torch.Tensor, k_v: torch.Tensor, v: torch.Tensor, alpha: torch.Tensor, beta: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token on a materialised state (baseline and flush share it): returns ``(u, S_h Diag(alpha) + u k^T)``."""
    u = beta.unsqueeze(-1) * (v - _matvec(s_h, alpha * k_v))
    return u, s_h * alpha.unsqueeze(-2) + u.unsqueeze(-1) * k_v.unsqueeze(-2)


def delta_rule_update_(
    state: torch.Tensor | Checkpoint, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gate: torch.Tensor,
    beta: torch.Tensor, scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor,
) -> None:
    """Float32 baseline step in place: read S, update, write S (state dtype), write ``out``; pad rows get zero
    outputs and touch no slot.

    ``log_gate [b,HV,C]`` and ``beta [b,HV]`` are float32 (already activated); arguments are validated by the caller.
    ``state``: the slot pool or a Checkpoint (decoded, stepped and re-encoded every step).
    """
    ckpt = as_checkpoint(state)
    rows, slots = active_rows(state_batch_indices, pad_slot_id, ckpt.shape[0])
    out[state_batch_indices == pad_slot_id] = 0
    if rows.numel() == 0:
        return
    f32 = torch.float32
    q_v, _, k_v = _inputs(q[rows], k[rows], scale, v.shape[1], f32)
    _, s_new = _fold(ckpt.fold_values(slots), k_v, v[rows].to(f32), torch.exp(log_gate[rows]), beta[rows])
    ckpt.store_(slots, s_new)
    out[rows] = _matvec(s_new, q_v).to(out.dtype)


def _history_order(ring: torch.Tensor, slots: torch.Tensor, origin: torch.Tensor | None) -> torch.Tensor:
    """``ring[slots]`` [n,heads,L,..] with each row's record j (ring position ``(origin + j) % L``) at index j;
    ``origin`` None: the records from position 0."""
    rows = ring[slots]
    if origin is None:
        return rows
    ring_len = ring.shape[2]
    pos = (origin.unsqueeze(1) + torch.arange(ring_len, device=origin.device)) % ring_len  # [n,L]
    return rows.gather(2, pos.view(-1, 1, ring_len, *(1,) * (rows.dim() - 3)).expand(rows.shape))


class _History:
    """Checkpoint (``s0``: what each row reads) and masked ring records of the active rows.

    Represents ``S_h = S0 Diag(e^G) + sum_{j<w} u_j (k_j e^{G-G_j})^T`` without building it unless asked. Record j of
    a row is at ring position j, or ``(origin + j) % L`` given ``origin`` [n] (a speculative history).
    ``predecayed_keys`` (KDA): ``k_ring [slots,HV,L,K]`` in the pre-decayed form (PREDECAY_FLOOR), whose entries
    decay by ``e^G`` alone.
    """

    def __init__(
        self, s0: torch.Tensor, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
        slots: torch.Tensor, w: torch.Tensor, num_v_heads: int, predecayed_keys: bool,
        origin: torch.Tensor | None = None,
    ) -> None:
        f32, dev = torch.float32, w.device
        ring_len = u_ring.shape[2]
        # Mask every record >= w before any arithmetic: stale entries may hold anything, NaN included.
        valid = (torch.arange(ring_len, device=dev) < w.unsqueeze(1))[:, None, :, None]  # [n,1,L,1]
        zero = torch.zeros((), dtype=f32, device=dev)
        g_hist = _history_order(g_ring, slots, origin)  # [n,HV,L,C]
        last = (w - 1).clamp_min(0)[:, None, None, None].expand(-1, num_v_heads, 1, g_hist.shape[-1])
        self.big_g = torch.where(w[:, None, None] > 0, g_hist.gather(2, last).squeeze(2), zero)  # G, [n,HV,C]
        decay = torch.exp(self.big_g.unsqueeze(2) - g_hist)  # exponents <= 0
        keys = _history_order(k_ring, slots, origin).to(f32)
        if predecayed_keys:
            pre = (g_hist >= -PREDECAY_FLOOR).all(-1, keepdim=True)  # [n,HV,L,1]
            decay = torch.where(pre, torch.exp(self.big_g).unsqueeze(2), decay)
        else:
            keys = _expand_heads(keys, num_v_heads)
        self.u = torch.where(valid, _history_order(u_ring, slots, origin).to(f32), zero)  # [n,HV,L,V]
        self.k_dec = torch.where(valid, keys, zero) * torch.where(valid, decay, zero)  # [n,HV,L,K]
        self.s0 = s0  # float32 checkpoints of the rows [n,HV,V,K]
        self.e_g = torch.exp(self.big_g)

    def materialize(self, sel: torch.Tensor) -> torch.Tensor:
        """``S_h`` of rows ``sel``: ``[n_sel,HV,V,K]``."""
        ring = torch.einsum("nhlv,nhlk->nhvk", self.u[sel], self.k_dec[sel])
        return self.s0[sel] * self.e_g[sel].unsqueeze(-2) + ring

    def matvec(self, sel: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``S_h x`` of rows ``sel`` without materialising S_h: checkpoint mat-vec plus ring dot products."""
        ring_dots = (self.k_dec[sel] * x.unsqueeze(2)).sum(-1)  # [n_sel,HV,L]
        return _matvec(self.s0[sel], self.e_g[sel] * x) + torch.einsum("nhlv,nhl->nhv", self.u[sel], ring_dots)


def folded_states(
    s0: torch.Tensor, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor, slots: torch.Tensor,
    w: torch.Tensor, predecayed_keys: bool = False,
) -> torch.Tensor:
    """float32 states ``S_h`` [n,HV,V,K] of rows ``slots``: their checkpoints ``s0`` [n,HV,V,K] with the first ``w``
    [n] records of their rings folded in (what a flush folds before its own token); rings as in
    :func:`delta_rule_replay_` (``g_ring [slots,HV,L,C]``), records at or past ``w`` never read."""
    hist = _History(s0, u_ring, k_ring, g_ring, slots, w, u_ring.shape[1], predecayed_keys)
    return hist.materialize(torch.arange(slots.shape[0], device=slots.device))


class _Token(NamedTuple):
    """One token's float32 inputs of the active rows: scaled normalised q per value head, normalised k per key head
    and per value head, v, the log-gate g, alpha = e^g and beta."""

    q_v: torch.Tensor
    k_hat: torch.Tensor
    k_v: torch.Tensor
    v: torch.Tensor
    g: torch.Tensor
    alpha: torch.Tensor
    beta: torch.Tensor

    @staticmethod
    def of(rows: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gate: torch.Tensor,
           beta: torch.Tensor, scale: float) -> _Token:
        q_v, k_hat, k_v = _inputs(q[rows], k[rows], scale, v.shape[1], torch.float32)
        g = log_gate[rows]
        return _Token(q_v, k_hat, k_v, v[rows].to(torch.float32), g, torch.exp(g), beta[rows])

    def select(self, sel: torch.Tensor) -> _Token:
        return _Token(*(x[sel] for x in self))

    def output(self, a_q: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """``o = a_q + u (k . q~)``."""
        return a_q + u * (self.k_v * self.q_v).sum(-1, keepdim=True)


def _append_token_(
    hist: _History, sel: torch.Tensor, tok: _Token, rings: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    slots: torch.Tensor, pos: torch.Tensor, predecayed_keys: bool,
) -> torch.Tensor:
    """A non-flush token of the rows ``sel`` of ``hist`` (``tok``: their inputs): returns its output and writes its
    records ``u``, ``k`` and ``G + g`` at ring positions ``pos`` [n_sel] of ``slots``: ``k`` once per key head, or with
    ``predecayed_keys`` (KDA) once per value head in the pre-decayed form (PREDECAY_FLOOR), in the ring dtypes."""
    u_ring, k_ring, g_ring = rings
    a_q = hist.matvec(sel, tok.alpha * tok.q_v)
    u = tok.beta.unsqueeze(-1) * (tok.v - hist.matvec(sel, tok.alpha * tok.k_v))
    s_sel, p_sel = slots.unsqueeze(1), pos.unsqueeze(1)
    hv_idx = torch.arange(tok.v.shape[1], device=pos.device).unsqueeze(0)
    g_new = hist.big_g[sel] + tok.g  # [n,HV,C]
    u_ring[s_sel, hv_idx, p_sel] = u.to(u_ring.dtype)
    if predecayed_keys:
        pre = (g_new >= -PREDECAY_FLOOR).all(-1, keepdim=True)
        key = torch.where(pre, tok.k_v * torch.exp(-g_new.clamp_min(-PREDECAY_FLOOR)), tok.k_v)
        k_ring[s_sel, hv_idx, p_sel] = key.to(k_ring.dtype)
    else:
        h_idx = torch.arange(tok.k_hat.shape[1], device=pos.device).unsqueeze(0)
        k_ring[s_sel, h_idx, p_sel] = tok.k_hat.to(k_ring.dtype)
    g_ring[s_sel, hv_idx, p_sel] = g_new
    return tok.output(a_q, u)


def delta_rule_replay_(
    state: torch.Tensor | Checkpoint, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
    cursor: torch.Tensor,
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gate: torch.Tensor, beta: torch.Tensor, scale: float,
    state_batch_indices: torch.Tensor, pad_slot_id: int, force_flush: bool, out: torch.Tensor,
    predecayed_keys: bool = False,
) -> None:
    """Float32 ReplaySSM step in place (docs/design.md "Cursor semantics"); pad rows get zero outputs and touch no
    slot.

    ``g_ring [slots,HV,L,C]`` holds the inclusive cumulative log-gate since the checkpoint; ``log_gate [b,HV,C]`` and
    ``beta [b,HV]`` are float32. With ``x~ = alpha x``: ``a_q = S_h q~``, ``u = beta (v - S_h k~)``,
    ``o = a_q + u (k . q)``. Flush rows fold into the checkpoint ``S_h Diag(alpha) + u k^T``, cursor 0, no append;
    other rows append ``u``, ``k`` and ``G + g`` at ring position w, cursor w+1: ``k`` once per key head, or with
    ``predecayed_keys`` (KDA) once per value head in the pre-decayed form (PREDECAY_FLOOR). Ring records are stored in
    the ring dtype and read back from it on later steps. Arguments are validated by the caller. ``state``: the slot
    pool or a Checkpoint (non-flush rows read its read copy, flush rows fold from and write its master and read copy).
    """
    ckpt = as_checkpoint(state)
    rows, slots = active_rows(state_batch_indices, pad_slot_id, ckpt.shape[0])
    out[state_batch_indices == pad_slot_id] = 0
    if rows.numel() == 0:
        return
    num_v_heads, ring_len = v.shape[1], u_ring.shape[2]
    checks.check_cursors(cursor, slots, pad_slot_id, ring_len, name="cursor")
    w = cursor[slots].long()
    tok = _Token.of(rows, q, k, v, log_gate, beta, scale)
    if force_flush:
        is_flush = torch.ones_like(w, dtype=torch.bool)
    else:
        is_flush = w == ring_len - 1
    if ckpt.read is None:
        s0 = ckpt.fold_values(slots)
    else:  # each row decodes one copy: flush rows the master, the others the read copy
        s0 = torch.empty(*slots.shape, *ckpt.shape[1:], device=slots.device)
        s0[is_flush] = ckpt.fold_values(slots[is_flush])
        s0[~is_flush] = ckpt.read_values(slots[~is_flush])
    hist = _History(s0, u_ring, k_ring, g_ring, slots, w, num_v_heads, predecayed_keys)

    sel = torch.nonzero(is_flush).squeeze(1)
    if sel.numel():
        s_h, t = hist.materialize(sel), tok.select(sel)
        a_q = _matvec(s_h, t.alpha * t.q_v)
        u, s_new = _fold(s_h, t.k_v, t.v, t.alpha, t.beta)
        ckpt.store_(slots[sel], s_new)
        cursor[slots[sel]] = 0
        out[rows[sel]] = t.output(a_q, u).to(out.dtype)

    sel = torch.nonzero(~is_flush).squeeze(1)
    if sel.numel():
        y = _append_token_(hist, sel, tok.select(sel), (u_ring, k_ring, g_ring), slots[sel], w[sel], predecayed_keys)
        cursor[slots[sel]] = (w[sel] + 1).to(cursor.dtype)
        out[rows[sel]] = y.to(out.dtype)


def delta_rule_verify_(
    state: torch.Tensor | Checkpoint, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
    cursor: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, log_gate: torch.Tensor,
    beta: torch.Tensor, scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor,
    predecayed_keys: bool = False,
) -> None:
    """Speculative verify in float32 (docs/algorithm.md): each row's window of T tokens (q, k [b,T,H,K], v
    [b,T,HV,V], log_gate [b,T,HV,C], beta [b,T,HV]) decoded in exact order from the checkpoint and the row's committed
    history (``core/spec_cursor.py``: ``count`` ring records from ``origin``), token t's ``u_t`` seeing the window's
    earlier tokens; out [b,T,HV,V]. When the history and two windows would overrun the ring, the history is first
    folded into a new checkpoint (stored by the write rule) and the cursor moves past it (origin + count, count 0);
    the window's cumulative log-gates then start from the new checkpoint. Token t's record goes to the ring position
    after the history and the window's earlier tokens; the commit (``spec_cursor.commit_``) keeps the accepted ones.
    Pad rows get zero outputs and touch no slot."""
    ckpt = as_checkpoint(state)
    rows, slots = active_rows(state_batch_indices, pad_slot_id, ckpt.shape[0])
    out[state_batch_indices == pad_slot_id] = 0
    if rows.numel() == 0:
        return
    T, ring_len = q.shape[1], u_ring.shape[2]
    words = [checks.spec_word(cursor, int(slot), T, ring_len) for slot in slots]
    origin, count = (torch.tensor(c, dtype=torch.long, device=slots.device) for c in zip(*words))
    fold = spec_cursor.folds_before(count, T, ring_len)
    if bool(fold.any()):
        hist = _History(ckpt.fold_values(slots[fold]), u_ring, k_ring, g_ring, slots[fold], count[fold],
                        v.shape[2], predecayed_keys, origin[fold])
        ckpt.store_(slots[fold], hist.materialize(torch.arange(int(fold.sum()), device=slots.device)))
        origin = torch.where(fold, (origin + count) % ring_len, origin)
        count = torch.where(fold, 0, count)
        cursor[slots[fold]] = spec_cursor.pack(origin[fold], 0).to(cursor.dtype)
    s0 = ckpt.read_values(slots)
    every = torch.arange(rows.numel(), device=rows.device)
    for t in range(T):
        tok = _Token.of(rows, q[:, t], k[:, t], v[:, t], log_gate[:, t], beta[:, t], scale)
        hist = _History(s0, u_ring, k_ring, g_ring, slots, count + t, v.shape[2], predecayed_keys, origin)
        y = _append_token_(hist, every, tok, (u_ring, k_ring, g_ring), slots, (origin + count + t) % ring_len,
                           predecayed_keys)
        out[rows, t] = y.to(out.dtype)


def delta_rule_per_draft_verify_(
    state: torch.Tensor, inter: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
    log_gate: torch.Tensor, beta: torch.Tensor, scale: float, state_batch_indices: torch.Tensor, pad_slot_id: int,
    out: torch.Tensor,
) -> None:
    """Per-draft-state verify in float32 (the speculative baseline): each row's window (as
    :func:`delta_rule_verify_`) as T baseline steps from the slot's state, the state after token t stored to
    ``inter [b,T,HV,V,K]`` (state dtype; the recurrence goes on unrounded); out [b,T,HV,V]. The slot's state is not
    written; pad rows get zero outputs and touch no draft."""
    rows, slots = active_rows(state_batch_indices, pad_slot_id, state.shape[0])
    out[state_batch_indices == pad_slot_id] = 0
    if rows.numel() == 0:
        return
    f32 = torch.float32
    s = state[slots].to(f32)
    for t in range(q.shape[1]):
        q_v, _, k_v = _inputs(q[rows, t], k[rows, t], scale, v.shape[2], f32)
        _, s = _fold(s, k_v, v[rows, t].to(f32), torch.exp(log_gate[rows, t]), beta[rows, t])
        inter[rows, t] = s.to(inter.dtype)
        out[rows, t] = _matvec(s, q_v).to(out.dtype)


def per_draft_commit_(state: torch.Tensor, inter: torch.Tensor, accepted: torch.Tensor,
                      state_batch_indices: torch.Tensor, pad_slot_id: int) -> None:
    """After a per-draft verify: each row's slot state <- its draft ``accepted[b] - 1`` (1 .. T); pad rows touch no
    slot."""
    rows, slots = active_rows(state_batch_indices, pad_slot_id, state.shape[0])
    if rows.numel() == 0:
        return
    a = accepted[rows].long()
    bad = ((a < 1) | (a > inter.shape[1])).nonzero()
    if bad.numel():
        row = int(rows[bad[0, 0]])
        raise ValueError(f"accepted: expected 1..{inter.shape[1]} per row (the bonus token included), got "
                         f"{int(accepted[row])} in row {row}")
    state[slots] = inter[rows, a - 1]


# -------------------------------------------------------------------------------------------------------------- GDN API
def log_gate(a: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:  # noqa: N803
    """``g = -exp(A_log) * softplus(a + dt_bias)`` (softplus threshold 20) in the promoted dtype of the inputs."""
    return -torch.exp(A_log) * F.softplus(a + dt_bias, threshold=20.0)


def sequential_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None = None,  # noqa: N803
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 ground truth for one GDN token over a batch of rows: returns ``(out [b,HV,V], new state [b,HV,V,K])``.

    ``state [b,HV,V,K]``, ``q, k [b,H,K]``, ``v [b,HV,V]``, raw ``a, b [b,HV]``, ``A_log, dt_bias [HV]``; any float
    dtypes.
    """
    f64 = torch.float64
    g = log_gate(a.to(f64), A_log.to(f64), dt_bias.to(f64)).unsqueeze(-1)
    beta = torch.sigmoid(b.to(f64))
    return delta_rule_sequential_step(state, q, k, v, g, beta, resolve_scale(scale, q.shape[-1]))


def _step_gates(
    a: torch.Tensor, b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor  # noqa: N803
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float32 ``(log_gate [b,HV,1] clamped to LOG_GATE_FLOOR, beta [b,HV])``."""
    f32 = torch.float32
    g = log_gate(a.to(f32), A_log.to(f32), dt_bias.to(f32)).clamp_min(LOG_GATE_FLOOR)
    return g.unsqueeze(-1), torch.sigmoid(b.to(f32))


def _check_step(
    state: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, state_batch_indices: torch.Tensor, out: torch.Tensor,  # noqa: N803
) -> tuple[int, int, int, int, int, int]:
    """Validate the step inputs shared by baseline and replay; return ``(batch, H, HV, K, V, slots)``."""
    batch, heads, v_heads, dim_k, dim_v = check_qkv(q, k, v)
    dev = q.device
    check_tensor("a", a, (batch, v_heads), FLOAT_DTYPES, dev)
    check_tensor("b", b, (batch, v_heads), FLOAT_DTYPES, dev)
    check_tensor("A_log", A_log, (v_heads,), FLOAT_DTYPES, dev)
    check_tensor("dt_bias", dt_bias, (v_heads,), FLOAT_DTYPES, dev)
    slots = check_state_io(state, state_batch_indices, out, batch, v_heads, dim_v, dim_k, dev)
    return batch, heads, v_heads, dim_k, dim_v, slots


def state_update_(
    state: torch.Tensor | Checkpoint, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None, state_batch_indices: torch.Tensor,  # noqa: N803
    pad_slot_id: int, out: torch.Tensor,
) -> None:
    """Float32 GDN baseline step in place: read S, update, write S (state dtype) and ``out``; pad rows get zero
    outputs."""
    check_scalars(pad_slot_id)
    _check_step(state, q, k, v, a, b, A_log, dt_bias, state_batch_indices, out)
    g, beta = _step_gates(a, b, A_log, dt_bias)
    scale = resolve_scale(scale, q.shape[-1])
    delta_rule_update_(state, q, k, v, g, beta, scale, state_batch_indices, pad_slot_id, out)


def check_rings(u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor, cursor: torch.Tensor,
                q: torch.Tensor, dims: tuple[int, int, int, int, int], per_channel_gate: bool) -> int:
    """GDN/KDA replay cache tensors against the step's dims (slots, H, HV, K, V); returns the ring length L.
    GDN: ``k_ring`` [slots, H, L, K], ``g_ring`` [slots, HV, L]. KDA (``per_channel_gate``): pre-decayed ``k_ring``
    [slots, HV, L, K] (core.layouts.key_ring_dtype), ``g_ring`` [slots, HV, L, K]."""
    slots, heads, v_heads, dim_k, dim_v = dims
    ring_len = check_rank("u_ring", u_ring, 4).shape[2]
    if ring_len < 1:
        raise ValueError(f"u_ring: expected a ring length (dim 2) >= 1, got shape {tuple(u_ring.shape)}")
    dev = q.device
    check_tensor("u_ring", u_ring, (slots, v_heads, ring_len, dim_v), (q.dtype,), dev)
    key_heads = v_heads if per_channel_gate else heads
    check_tensor("k_ring", k_ring, (slots, key_heads, ring_len, dim_k), (key_ring_dtype(q.dtype, per_channel_gate),),
                 dev)
    gate_shape = (slots, v_heads, ring_len, dim_k) if per_channel_gate else (slots, v_heads, ring_len)
    check_tensor("g_ring", g_ring, gate_shape, (torch.float32,), dev)
    check_tensor("cursor", cursor, (slots,), (torch.int32,), dev)
    return ring_len


def replay_step_(
    state: torch.Tensor | Checkpoint, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
    cursor: torch.Tensor,
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None,  # noqa: N803
    state_batch_indices: torch.Tensor, pad_slot_id: int, force_flush: bool, out: torch.Tensor,
) -> None:
    """Float32 GDN ReplaySSM step in place on the cache (state, rings, cursor) and ``out``; the ops' CPU fallback.

    Cache: ``state [slots,HV,V,K]`` fp32/fp16/bf16, ``u_ring [slots,HV,L,V]`` and ``k_ring [slots,H,L,K]`` in the
    activation dtype, ``g_ring [slots,HV,L]`` fp32 (inclusive cumulative log-gate since the checkpoint),
    ``cursor [slots]`` int32. Step: ``q, k [b,H,K]``, ``v [b,HV,V]``, raw ``a, b [b,HV]``, ``A_log, dt_bias [HV]``,
    ``scale`` (None: K^-0.5), ``state_batch_indices [b]`` int32. A row flushes when its cursor is L-1 or
    ``force_flush``.
    """
    check_scalars(pad_slot_id, force_flush)
    _, heads, v_heads, dim_k, dim_v, slots = _check_step(state, q, k, v, a, b, A_log, dt_bias, state_batch_indices, out)
    check_rings(u_ring, k_ring, g_ring, cursor, q, (slots, heads, v_heads, dim_k, dim_v), per_channel_gate=False)
    g, beta = _step_gates(a, b, A_log, dt_bias)
    delta_rule_replay_(
        state, u_ring, k_ring, g_ring.unsqueeze(-1), cursor, q, k, v, g, beta, resolve_scale(scale, dim_k),
        state_batch_indices, pad_slot_id, force_flush, out,
    )


def verify_step_(
    state: torch.Tensor | Checkpoint, u_ring: torch.Tensor, k_ring: torch.Tensor, g_ring: torch.Tensor,
    cursor: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor, b: torch.Tensor,
    A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None,  # noqa: N803
    state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor,
) -> None:
    """GDN speculative verify (:func:`delta_rule_verify_`): q, k [b,T,H,K], v [b,T,HV,V], raw a, b [b,T,HV];
    out [b,T,HV,V]."""
    g, beta = _step_gates(a, b, A_log, dt_bias)
    delta_rule_verify_(state, u_ring, k_ring, g_ring.unsqueeze(-1), cursor, q, k, v, g, beta,
                       resolve_scale(scale, q.shape[-1]), state_batch_indices, pad_slot_id, out)


def per_draft_verify_(
    state: torch.Tensor, inter: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, a: torch.Tensor,
    b: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor, scale: float | None,  # noqa: N803
    state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor,
) -> None:
    """GDN per-draft-state verify (:func:`delta_rule_per_draft_verify_`), inputs as :func:`verify_step_`."""
    g, beta = _step_gates(a, b, A_log, dt_bias)
    delta_rule_per_draft_verify_(state, inter, q, k, v, g, beta, resolve_scale(scale, q.shape[-1]),
                                 state_batch_indices, pad_slot_id, out)
