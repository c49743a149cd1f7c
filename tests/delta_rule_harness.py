"""Shared driver for the GDN/KDA reference tests: replay cache vs float64 sequential ground truth.

A ``Family`` adapter wraps one reference module (inputs, float64 step, float32 replay and baseline); ``run_replay``
steps a batch of rows with staggered cursors and a permanent pad row, and records output and checkpoint errors.
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from trtllm_replayssm.core.layouts import key_ring_dtype

PAD = -1
INT_VIEW = {
    torch.float32: torch.int32, torch.float16: torch.int16, torch.bfloat16: torch.int16, torch.int32: torch.int32
}


@contextlib.contextmanager
def flush_denormals() -> Iterator[None]:
    """Flush float32 subnormals to zero (as CUDA's -ftz does): strongly decaying gates make subnormals, CPU arithmetic
    on them is several times slower, and the affected values are below 1e-38."""
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def bits(t: torch.Tensor) -> torch.Tensor:
    """Bit pattern of ``t`` (so NaN-filled tensors compare exactly)."""
    return t.contiguous().view(INT_VIEW[t.dtype]).clone()


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """``max |x - ref| / max |ref|`` in float64."""
    ref = ref.double()
    return float((x.double() - ref).abs().max() / ref.abs().max())


@dataclass
class Family:
    """One delta-rule family: how to draw a step's inputs and call its reference functions.

    ``draw(batch, gen, dtype) -> dict`` of step inputs; ``sequential(state64, inputs) -> (out, state)``;
    ``replay(cache, inputs, idx, force_flush, out)``; ``update(state, inputs, idx, out)``.
    """

    heads: int
    v_heads: int
    dim: int  # K == V
    gate_channels: int  # 1 (per-head gate ring [slots,HV,L]) or K (per-channel ring [slots,HV,L,K])
    draw: Callable[..., dict[str, torch.Tensor]]
    sequential: Callable[..., tuple[torch.Tensor, torch.Tensor]]
    replay: Callable[..., None]
    update: Callable[..., None]


@dataclass
class Cache:
    """Checkpoint, rings (views into NaN-filled pages with one spare ring position) and cursors."""

    state: torch.Tensor
    u_page: torch.Tensor
    k_page: torch.Tensor
    g_page: torch.Tensor
    cursor: torch.Tensor
    ring_len: int

    @property
    def u_ring(self) -> torch.Tensor:
        return self.u_page[:, :, : self.ring_len]

    @property
    def k_ring(self) -> torch.Tensor:
        return self.k_page[:, :, : self.ring_len]

    @property
    def g_ring(self) -> torch.Tensor:
        return self.g_page[:, :, : self.ring_len]

    def snapshot(self) -> list[torch.Tensor]:
        return [bits(t) for t in (self.state, self.u_page, self.k_page, self.g_page, self.cursor)]


def make_cache(
    fam: Family, slots: int, ring_len: int, act_dtype: torch.dtype, state_dtype: torch.dtype, gen: torch.Generator
) -> Cache:
    """Random checkpoint (never zero), NaN rings (stale memory the replay must never read), zero cursors."""
    d, hv = fam.dim, fam.v_heads
    state = (0.3 * torch.randn(slots, hv, d, d, generator=gen)).to(state_dtype)
    nan = float("nan")
    u_page = torch.full((slots, hv, ring_len + 1, d), nan, dtype=act_dtype)
    kda = fam.gate_channels > 1  # one pre-decayed key per value head
    k_page = torch.full((slots, fam.v_heads if kda else fam.heads, ring_len + 1, d), nan,
                        dtype=key_ring_dtype(act_dtype, kda))
    g_shape = (slots, hv, ring_len + 1) + ((d,) if fam.gate_channels > 1 else ())
    g_page = torch.full(g_shape, nan, dtype=torch.float32)
    return Cache(state, u_page, k_page, g_page, torch.zeros(slots, dtype=torch.int32), ring_len)


@dataclass
class RunStats:
    out_err: list[float] = field(default_factory=list)  # per step, active rows
    flush_state_err: list[float] = field(default_factory=list)  # per (flush, row)
    flushes_per_row: dict[int, int] = field(default_factory=dict)


def run_replay(
    fam: Family, ring_len: int, main_steps: int, warmups: list[int], *, act_dtype: torch.dtype = torch.float32,
    state_dtype: torch.dtype = torch.float32, seed: int = 0, slots: int = 7, force_flush_every: int = 0,
) -> tuple[RunStats, Cache, dict[str, object]]:
    """Step ``len(warmups)`` rows plus one permanent pad row through the replay and the float64 recurrence.

    Row ``r`` runs ``warmups[r]`` steps alone first (other rows padded), so cursors are staggered; then all rows run
    ``main_steps`` steps. ``force_flush_every > 0`` forces a flush on every such main step. Returns the error stats,
    the cache and a dict with the final ``out``, the untouched-slot snapshot info and the slot map.
    """
    gen = torch.Generator().manual_seed(seed)
    cache = make_cache(fam, slots, ring_len, act_dtype, state_dtype, gen)
    n_rows = len(warmups)
    row_slots = [(3 * r + 2) % slots for r in range(n_rows)]
    assert len(set(row_slots)) == n_rows and n_rows < slots
    ref_state = {s: cache.state[s].double() for s in row_slots}
    before = cache.snapshot()
    batch = n_rows + 1  # last row is always padding
    out = torch.full((batch, fam.v_heads, fam.dim), float("nan"), dtype=act_dtype)
    stats = RunStats(flushes_per_row={r: 0 for r in range(n_rows)})
    total = max(warmups) + main_steps
    cursors_at_main: list[int] = []
    for step in range(total):
        main = step >= max(warmups)
        if step == max(warmups):
            cursors_at_main = [int(cache.cursor[s]) for s in row_slots]
        active = [r for r in range(n_rows) if main or step < warmups[r]]
        idx = torch.tensor([row_slots[r] if r in active else PAD for r in range(n_rows)] + [PAD], dtype=torch.int32)
        inputs = fam.draw(batch, gen, act_dtype)
        force = main and force_flush_every > 0 and (step - max(warmups)) % force_flush_every == 0
        cursor_before = cache.cursor.clone()
        fam.replay(cache, inputs, idx, force, out)
        rows = torch.tensor(active)
        sel = {key: val[rows] for key, val in inputs.items()}
        s64 = torch.stack([ref_state[row_slots[r]] for r in active])
        o_ref, s_new = fam.sequential(s64, sel)
        for i, r in enumerate(active):
            ref_state[row_slots[r]] = s_new[i]
        stats.out_err.append(rel_err(out[rows], o_ref))
        for i, r in enumerate(active):
            slot = row_slots[r]
            flushed = force or int(cursor_before[slot]) == ring_len - 1
            assert int(cache.cursor[slot]) == (0 if flushed else int(cursor_before[slot]) + 1)
            if flushed:
                stats.flush_state_err.append(rel_err(cache.state[slot], s_new[i]))
                stats.flushes_per_row[r] += 1
    after = cache.snapshot()
    info = {"out": out, "before": before, "after": after, "row_slots": row_slots, "cursors_at_main": cursors_at_main}
    return stats, cache, info


def assert_untouched_outside(cache: Cache, info: dict[str, object]) -> None:
    """Slots no row used and the spare ring position of every page are bit-identical; the pad row's out is zeros."""
    used = set(info["row_slots"])
    unused = [s for s in range(cache.state.shape[0]) if s not in used]
    before, after = info["before"], info["after"]
    for b, a in zip(before, after):
        assert torch.equal(b[unused], a[unused])
    for b, a in zip(before[1:4], after[1:4]):  # ring pages: the spare position L
        assert torch.equal(b[:, :, cache.ring_len :], a[:, :, cache.ring_len :])
    assert (info["out"][-1] == 0).all()


def check_l1_matches_baseline(fam: Family, state_dtype: torch.dtype, steps: int = 6, seed: int = 1) -> None:
    """With L = 1 every replay step flushes: the checkpoint must be bit-identical to the baseline state each step."""
    gen = torch.Generator().manual_seed(seed)
    cache = make_cache(fam, 5, 1, torch.float32, state_dtype, gen)
    base_state = cache.state.clone()
    for step in range(steps):
        out_r = torch.full((4, fam.v_heads, fam.dim), float("nan"))
        out_b = out_r.clone()
        idx = torch.tensor([4, 0, PAD, 2] if step % 2 else [1, PAD, 3, 0], dtype=torch.int32)
        inputs = fam.draw(4, gen, torch.float32)
        fam.replay(cache, inputs, idx, False, out_r)
        fam.update(base_state, inputs, idx, out_b)
        assert torch.equal(bits(cache.state), bits(base_state))
        assert torch.equal(cache.cursor, torch.zeros_like(cache.cursor))
        live = idx != PAD
        torch.testing.assert_close(out_r[live], out_b[live], rtol=1e-5, atol=1e-6)
        assert (out_r[~live] == 0).all() and (out_b[~live] == 0).all()


def check_pad_rows_untouched(fam: Family, ring_len: int = 8, seed: int = 2) -> None:
    """Mid-cycle slots whose rows are padded keep state, rings and cursor bit-identical; their out rows are zeros."""
    gen = torch.Generator().manual_seed(seed)
    cache = make_cache(fam, 6, ring_len, torch.bfloat16, torch.float32, gen)
    out = torch.zeros(4, fam.v_heads, fam.dim, dtype=torch.bfloat16)
    for step in range(ring_len // 2 + 1):  # fill the rings of slots 1..4 part way
        fam.replay(cache, fam.draw(4, gen, torch.bfloat16), torch.tensor([1, 2, 3, 4], dtype=torch.int32), False, out)
    assert (cache.cursor[1:5] == ring_len // 2 + 1).all()
    for idx_list in ([PAD, 2, PAD, 4], [PAD, PAD, PAD, PAD]):
        before = cache.snapshot()
        out = torch.full((4, fam.v_heads, fam.dim), float("nan"), dtype=torch.bfloat16)
        idx = torch.tensor(idx_list, dtype=torch.int32)
        fam.replay(cache, fam.draw(4, gen, torch.bfloat16), idx, False, out)
        after = cache.snapshot()
        touched = [s for s in idx_list if s != PAD]
        untouched = [s for s in range(6) if s not in touched]
        for b, a in zip(before, after):
            assert torch.equal(b[untouched], a[untouched])
        pad_rows = torch.tensor([s == PAD for s in idx_list])
        assert (out[pad_rows] == 0).all()
        assert not torch.isnan(out[~pad_rows]).any()
