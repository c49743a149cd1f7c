"""Mamba-2 decode in pure PyTorch: the float64 sequential recurrence (ground truth) and the float32 replay step.

``replay_step_`` / ``state_update_`` have the exact semantics of the CUDA kernels (cursor rules of docs/design.md,
ring contents, pad rows) and serve as the CPU fallback of the ops. ``verify_step_`` is speculative
decoding from checkpoint + ring (docs/algorithm.md, speculative verify): outputs for a window of T tokens, their
records appended past the committed history (folded into the checkpoint first when the ring would overrun), and a
commit that adds the accepted count to the history (rejected records are never read again).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from trtllm_replayssm.core import checks, spec_cursor
from trtllm_replayssm.core.checkpoint import Checkpoint, as_checkpoint


def softplus_thr20(v: torch.Tensor) -> torch.Tensor:
    """softplus with identity above 20 (the threshold of the Mamba-2 / GDN reference code)."""
    return torch.where(v > 20.0, v, F.softplus(v))


def _delta(dt: torch.Tensor, dt_bias: torch.Tensor | None, dt_softplus: bool, dtype: torch.dtype) -> torch.Tensor:
    d = dt.to(dtype)
    if dt_bias is not None:
        d = d + dt_bias.to(dtype)
    return softplus_thr20(d) if dt_softplus else d


def decay_exponent(A: torch.Tensor, delta_sum: torch.Tensor) -> torch.Tensor:
    """``A · ΣΔ``, 0 where either factor is 0 (no elapsed time or no decay: ``A = -inf`` with ``Δ = 0`` and ``A = 0``
    with ``Δ = inf`` give no decay instead of NaN), as the kernels compute it."""
    prod = A * delta_sum
    return torch.where((A == 0) | (delta_sum == 0), torch.zeros_like(prod), prod)


def _heads_to_groups(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """[..., G, N] -> [..., H, N] (head h uses group h // (H/G))."""
    return t.repeat_interleave(nheads // t.shape[-2], dim=-2)


def sequential_step(state: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                    C: torch.Tensor, D: torch.Tensor | None = None, z: torch.Tensor | None = None,
                    dt_bias: torch.Tensor | None = None, dt_softplus: bool = True,
                    dtype: torch.dtype = torch.float64) -> tuple[torch.Tensor, torch.Tensor]:
    """One recurrence step for a batch: state [b,H,P,N], x [b,H,P], dt [b,H], B/C [b,G,N] -> (new state, y [b,H,P]).

    S = exp(A Δ) S + Δ x Bᵀ ;  y = S C + D x ;  y *= silu(z).  All math in ``dtype`` (float64 for ground truth).
    """
    H = x.shape[1]
    S = state.to(dtype)
    delta = _delta(dt, dt_bias, dt_softplus, dtype)                                   # [b, H]
    Bh, Ch = _heads_to_groups(B.to(dtype), H), _heads_to_groups(C.to(dtype), H)       # [b, H, N]
    decay = torch.exp(decay_exponent(A.to(dtype)[None, :], delta))                    # [b, H]
    xs = x.to(dtype)
    S = decay[..., None, None] * S + (delta[..., None] * xs)[..., None] * Bh[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", S, Ch)
    if D is not None:
        y = y + D.to(dtype)[None, :, None] * xs
    if z is not None:
        y = y * F.silu(z.to(dtype))
    return S, y


def state_update_(state: torch.Tensor | Checkpoint, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                  C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
                  dt_softplus: bool, state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor) -> None:
    """Baseline step in float32, in place on the slot pool ``state`` [slots,H,P,N] (or a Checkpoint: decoded, stepped
    and re-encoded every step); pad rows get zero outputs and touch no slot."""
    ckpt = as_checkpoint(state)
    out[state_batch_indices == pad_slot_id] = 0
    valid = (state_batch_indices != pad_slot_id).nonzero().flatten()
    if valid.numel() == 0:
        return
    slots = state_batch_indices[valid].long()
    new_state, y = sequential_step(ckpt.fold_values(slots), x[valid], dt[valid], A, B[valid], C[valid],
                                   D, None if z is None else z[valid], dt_bias, dt_softplus, dtype=torch.float32)
    ckpt.store_(slots, new_state)
    out[valid] = y.to(out.dtype)


def _live_rows(state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor | None):
    """``(row, slot)`` of every batch row that is not a pad row; a pad row's ``out`` (if given) is zeroed."""
    for b in range(state_batch_indices.shape[0]):
        slot = int(state_batch_indices[b])
        if slot == pad_slot_id:
            if out is not None:
                out[b] = 0
            continue
        yield b, slot


def _weights(deltas: torch.Tensor, A: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Ring weights ``s_j = Δ_j exp(A Σ_{i>j} Δ_i)`` [H, n] and the checkpoint's ``decay = exp(A ΣΔ)`` [H] of the
    entries ``deltas`` [H, n] (the newest last)."""
    suffix = deltas.flip(1).cumsum(1).flip(1)                                                    # Σ_{i>=j} Δ_i
    excl = torch.cat([suffix[:, 1:], torch.zeros_like(suffix[:, :1])], dim=1)                    # Σ_{i>j} Δ_i
    return deltas * torch.exp(decay_exponent(A[:, None], excl)), torch.exp(decay_exponent(A, deltas.sum(1)))


def replay_step_(state: torch.Tensor | Checkpoint, x_ring: torch.Tensor, dt_ring: torch.Tensor, B_ring: torch.Tensor,
                 cursor: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
                 dt_softplus: bool, state_batch_indices: torch.Tensor, pad_slot_id: int, force_flush: bool,
                 out: torch.Tensor) -> None:
    """ReplaySSM step in float32, in place on cache tensors (see docs/design.md for the cursor rules).

    Non-flush rows: y from checkpoint + ring without writing the checkpoint; append (x, Δ, B) at the cursor.
    Flush rows (cursor == L-1 or ``force_flush``): fold ring + current token into a new checkpoint, cursor <- 0.
    Pad rows get zero outputs and touch no slot. ``state``: the slot pool or a Checkpoint (non-flush rows read its
    read copy, flush rows fold from and write its master and read copy).
    """
    ckpt = as_checkpoint(state)
    f32 = torch.float32
    H, L = x.shape[1], x_ring.shape[2]
    heads_per_group = H // B.shape[1]
    delta_all = _delta(dt, dt_bias, dt_softplus, f32)
    A32 = A.to(f32)
    for b, slot in _live_rows(state_batch_indices, pad_slot_id, out):
        w = int(cursor[slot])
        flush = force_flush or w >= L - 1
        deltas = torch.cat([dt_ring[slot, :, :w].to(f32), delta_all[b, :, None]], dim=1)        # [H, w+1]
        s, decay = _weights(deltas, A32)
        xs = torch.cat([x_ring[slot, :, :w].to(f32), x[b, :, None].to(f32)], dim=1)              # [H, w+1, P]
        Bs = torch.cat([B_ring[slot, :, :w].to(f32), B[b, :, None].to(f32)], dim=1)              # [G, w+1, N]
        Bs = Bs.repeat_interleave(heads_per_group, dim=0)                                         # [H, w+1, N]
        Ch = C[b].to(f32).repeat_interleave(heads_per_group, dim=0)                               # [H, N]
        slot_ids = torch.tensor([slot], device=x.device)
        if flush:
            S0 = ckpt.fold_values(slot_ids)[0]
            S = decay[:, None, None] * S0 + torch.einsum("hj,hjp,hjn->hpn", s, xs, Bs)
            ckpt.store_(slot_ids, S[None])
            y = torch.einsum("hpn,hn->hp", S, Ch)
            cursor[slot] = 0
        else:
            S0 = ckpt.read_values(slot_ids)[0]
            bc = torch.einsum("hjn,hn->hj", Bs, Ch)
            y = decay[:, None] * torch.einsum("hpn,hn->hp", S0, Ch) + torch.einsum("hj,hjp->hp", s * bc, xs)
            x_ring[slot, :, w] = x[b].to(x_ring.dtype)
            dt_ring[slot, :, w] = delta_all[b]
            B_ring[slot, :, w] = B[b].to(B_ring.dtype)
            cursor[slot] = w + 1
        if D is not None:
            y = y + D.to(f32)[:, None] * x[b].to(f32)
        if z is not None:
            y = y * F.silu(z[b].to(f32))
        out[b] = y.to(out.dtype)


def _fold_history(ckpt: Checkpoint, x_ring: torch.Tensor, dt_ring: torch.Tensor, B_ring: torch.Tensor, slot: int,
                  positions: torch.Tensor, A32: torch.Tensor) -> None:
    """Fold the ring records at ``positions`` (oldest first) into a new checkpoint of ``slot`` (stored by the write
    rule): ``S = decay S0 + Σ_j s_j x_j B_jᵀ``."""
    f32 = torch.float32
    heads_per_group = x_ring.shape[1] // B_ring.shape[1]
    s, decay = _weights(dt_ring[slot][:, positions].to(f32), A32)
    xs = x_ring[slot][:, positions].to(f32)
    Bs = B_ring[slot][:, positions].to(f32).repeat_interleave(heads_per_group, dim=0)
    slot_ids = torch.tensor([slot], device=x_ring.device)
    S = decay[:, None, None] * ckpt.fold_values(slot_ids)[0] + torch.einsum("hj,hjp,hjn->hpn", s, xs, Bs)
    ckpt.store_(slot_ids, S[None])


def verify_step_(state: torch.Tensor | Checkpoint, x_ring: torch.Tensor, dt_ring: torch.Tensor, B_ring: torch.Tensor,
                 cursor: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor, B: torch.Tensor,
                 C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None, dt_bias: torch.Tensor | None,
                 dt_softplus: bool, state_batch_indices: torch.Tensor, pad_slot_id: int, out: torch.Tensor) -> None:
    """Speculative verify in float32: each row's window of ``T`` tokens (x [b,T,H,P], dt [b,T,H], B/C [b,T,G,N],
    z [b,T,H,P]) decoded from the checkpoint and the row's committed history (``core/spec_cursor.py``: ``count``
    ring records from ``origin``), token ``t`` seeing the window's tokens before it; out [b,T,H,P]. When the history
    and two windows would overrun the ring, the history is first folded into a new checkpoint and the cursor moves
    past it (origin + count, count 0). The window's records go to the ring positions after the history; the commit
    (``spec_cursor.commit_``) keeps the accepted ones. Pad rows get zero outputs and touch no slot."""
    ckpt = as_checkpoint(state)
    f32 = torch.float32
    T, H, R = x.shape[1], x.shape[2], x_ring.shape[2]
    heads_per_group = H // B.shape[2]
    A32 = A.to(f32)
    for b, slot in _live_rows(state_batch_indices, pad_slot_id, out):
        origin, count = checks.spec_word(cursor, slot, T, R)
        if spec_cursor.folds_before(count, T, R):
            _fold_history(ckpt, x_ring, dt_ring, B_ring, slot, (origin + torch.arange(count)) % R, A32)
            origin, count = (origin + count) % R, 0
            cursor[slot] = spec_cursor.pack(origin, 0)
        positions = (origin + torch.arange(count + T)) % R
        window = positions[count:]
        x_ring[slot][:, window] = x[b].transpose(0, 1).to(x_ring.dtype)
        dt_ring[slot][:, window] = _delta(dt[b], dt_bias, dt_softplus, f32).transpose(0, 1)
        B_ring[slot][:, window] = B[b].transpose(0, 1).to(B_ring.dtype)
        S0 = ckpt.read_values(torch.tensor([slot], device=x.device))[0]
        for t in range(T):
            seen = positions[:count + t + 1]                                                       # oldest first
            s, decay = _weights(dt_ring[slot][:, seen].to(f32), A32)
            xs = x_ring[slot][:, seen].to(f32)                                                     # [H, n, P]
            Bs = B_ring[slot][:, seen].to(f32).repeat_interleave(heads_per_group, dim=0)           # [H, n, N]
            Ch = C[b, t].to(f32).repeat_interleave(heads_per_group, dim=0)                        # [H, N]
            bc = torch.einsum("hjn,hn->hj", Bs, Ch)
            y = decay[:, None] * torch.einsum("hpn,hn->hp", S0, Ch) + torch.einsum("hj,hjp->hp", s * bc, xs)
            if D is not None:
                y = y + D.to(f32)[:, None] * x[b, t].to(f32)
            if z is not None:
                y = y * F.silu(z[b, t].to(f32))
            out[b, t] = y.to(out.dtype)



def per_draft_verify_(state: torch.Tensor, inter: torch.Tensor, x: torch.Tensor, dt: torch.Tensor, A: torch.Tensor,
                      B: torch.Tensor, C: torch.Tensor, D: torch.Tensor | None, z: torch.Tensor | None,
                      dt_bias: torch.Tensor | None, dt_softplus: bool, state_batch_indices: torch.Tensor,
                      pad_slot_id: int, out: torch.Tensor) -> None:
    """The per-draft-state verify in float32 (the baseline of speculative decoding): each row's T recurrence steps
    from its slot's state (window inputs as :func:`verify_step_`), the state after window token t stored to
    ``inter[b, t]`` [b,T,H,P,N] (its dtype); out [b,T,H,P]. The pool ``state`` is not written
    (:func:`per_draft_commit_`). Pad rows get zero outputs and touch nothing."""
    for b, slot in _live_rows(state_batch_indices, pad_slot_id, out):
        S = state[slot:slot + 1].float()
        for t in range(x.shape[1]):
            S, y = sequential_step(S, x[b:b + 1, t], dt[b:b + 1, t], A, B[b:b + 1, t], C[b:b + 1, t], D,
                                   None if z is None else z[b:b + 1, t], dt_bias, dt_softplus, dtype=torch.float32)
            inter[b, t] = S[0].to(inter.dtype)
            out[b, t] = y[0].to(out.dtype)


def per_draft_commit_(state: torch.Tensor, inter: torch.Tensor, accepted: torch.Tensor,
                      state_batch_indices: torch.Tensor, pad_slot_id: int) -> None:
    """After :func:`per_draft_verify_`: each row's slot state <- ``inter[b, accepted[b] - 1]`` (1..T). Pad rows
    touch nothing."""
    window = inter.shape[1]
    for b, slot in _live_rows(state_batch_indices, pad_slot_id, None):
        a = int(accepted[b])
        if not 1 <= a <= window:
            raise ValueError(f"accepted: expected 1..{window} per row (the bonus token included), got {a} in row {b}")
        state[slot] = inter[b, a - 1]
