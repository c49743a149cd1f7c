"""Speculative verify benchmark (``bench kernels --spec T``): one verify step of T tokens per row, the commit of its
accepted counts included, for our replay verify and our per-draft-state verify (the baseline every peer's
speculative path follows), side by side in one process, for every family (:data:`SPEC_OPS`).

Protocol as the kernel benchmark (docs/benchmarks.md): the copy ceiling measured first in the same run; cold L2 by
rotating independent pools (checkpoint + rings, or state + per-draft buffer) inside one CUDA graph of ``steps``
verify steps x pools; the median of >= 15 graph replays per call. Each row's accepted count is drawn once per case,
uniformly from 1..T, and stays fixed (a device tensor), so the graph replays the same pattern; cursors start
staggered (origin and history length by row) over rings of L + T records, so folds fall on different steps;
GDN/KDA gate rings are rotated so each row's records from its origin hold falling cumulative log-gates.

With ``peers`` the peers follow in the same process (``peers.build_spec_peer``): for Mamba-2 FlashInfer 0.7.0.post1's
``flashinfer_checkpointing_ssu`` (its ring API, rings of R = L + T rows, the trackers' bookkeeping in the step) and
``flashinfer_ssu_mtp`` (``selective_state_update`` writing one state per window token, the accepted one copied back
in the step); for GDN and KDA fla-core 0.6.0's per-draft verify, ``fla_gdn_mtp`` / ``fla_kda_mtp`` (T state slots
per row, the next verify starting from the accepted one). A peer that cannot run a case (another family, an
unsupported shape) is recorded in ``skipped`` with the reason.

Byte model per row and step (``|S|`` the state; records and each token's inputs and outputs as the standard-decode
model counts them, ``core.byte_model.record_bytes`` and ``io_bytes``, bf16 activations): replay ``|S| (1 + f)`` plus
the history's ring records read (KDA's pre-decayed keys: values and keys, and one gate row), the window's T records
written and T tokens' I/O (f: folds per verify of the pattern, each writing the state once); per-draft
``|S| (1 + T)`` for the verify, the commit's copies of ``|S|`` (:data:`PER_DRAFT_COMMIT_STATES`) and the T tokens'
I/O. FlashInfer's ring peer counts as replay on its own rings (its flush rule is our fold rule at R = L + T).
"""
from __future__ import annotations

import datetime as _dt
import gc
import platform
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, fields, replace

import torch

from trtllm_replayssm.core import byte_model as core_bytes
from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.cache import GDNLayerCache
from trtllm_replayssm.core.dims import SSMDims
from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import parse_state_label
from trtllm_replayssm.core.limits import MAX_BUFFER_LEN, MAX_WINDOW
from trtllm_replayssm.core.ops import delta, gdn, kda, mamba2_spec, spec
from trtllm_replayssm.core.plans import Tuning
from trtllm_replayssm.core.samples import DeltaStep, Mamba2Step, fill_rings_, random_state, slot_indices

from . import timing
from .byte_model import ACT_DTYPE
from .peers import SPEC_PEERS, PeerUnavailable, build_spec_peer, peer_versions
from .shapes import BenchShape, select_shapes

IMPLS = ("replay_verify", "per_draft_verify")
STEPS_PER_GRAPH = 8
# States a per-draft commit moves: ours reads the accepted draft and writes the slot; FlashInfer's peer gathers the
# drafts, then copies them; fla-core's next verify reads the accepted draft where it lies.
PER_DRAFT_COMMIT_STATES = {"per_draft_verify": 2, "flashinfer_ssu_mtp": 4, "fla_gdn_mtp": 0, "fla_kda_mtp": 0}


@dataclass(frozen=True)
class SpecOps:
    """A family's speculative ops, taking a window's ``op_args()``: ``verify(layer, *args, **kwargs, ...)``,
    ``per_draft_verify(state, inter, *args, **kwargs, ...)``, ``per_draft_commit(state, inter, accepted, idx)``;
    the row tiles they launch: ``verify_tile(layer, batch, window, ...)`` and ``per_draft_tile(state, batch)``."""

    verify: Callable
    per_draft_verify: Callable
    per_draft_commit: Callable
    verify_tile: Callable
    per_draft_tile: Callable


def _delta_verify_tile(layer, batch: int, window: int, tuning: Tuning = delta.VERIFY_TUNING) -> int:
    return delta.verify_plan(layer, batch, window, tuning).rows_per_cta


def _mamba2_verify_tile(layer, batch: int, window: int, tuning: Tuning = mamba2_spec.VERIFY_TUNING) -> int:
    return mamba2_spec.verify_plan(layer, batch, window, tuning).rows_per_cta


SPEC_OPS: dict[str, SpecOps] = {
    "mamba2": SpecOps(mamba2_spec.verify_decode, mamba2_spec.per_draft_verify, mamba2_spec.per_draft_commit,
                      _mamba2_verify_tile, mamba2_spec.rows_per_cta),
    "gdn": SpecOps(gdn.verify_decode, gdn.per_draft_verify_decode, delta.per_draft_commit, _delta_verify_tile,
                   delta.window_tile),
    "kda": SpecOps(kda.verify_decode, kda.per_draft_verify_decode, delta.per_draft_commit, _delta_verify_tile,
                   delta.window_tile),
}


@dataclass
class SpecRecord:
    family: str
    model: str
    impl: str
    batch: int
    state_dtype: str
    L: int
    spec_tokens: int
    mean_accept: float
    median_us: float
    bytes_per_call: float
    model_gbps: float
    pct_of_copy: float
    folds_per_verify: float | None = None
    n_pools: int = 0
    calls_per_graph: int = 0
    finite: bool | None = None
    rows_per_cta: int = 0


def start_words(batch: int, window: int, ring: int) -> list[int]:
    """Staggered cursor words of the batch rows: origin and history length by row, every one a valid start."""
    longest = ring - 2 * window  # a longer history folds at once
    return [spec_cursor.pack(r % ring, r % (longest + 1)) for r in range(batch)]


def folds_per_verify(accepted: list[int], window: int, ring: int, steps: int = 1024) -> float:
    """Mean folds per row and verify of the fixed pattern ``accepted`` from the staggered starts."""
    folds = 0
    for word, a in zip(start_words(len(accepted), window, ring), accepted):
        count = spec_cursor.unpack(word)[1]
        for _ in range(steps):
            if spec_cursor.folds_before(count, window, ring):
                folds, count = folds + 1, 0
            count += a
    return folds / (steps * len(accepted))


def window_step(dims: SSMDims, batch: int, window: int, gen: torch.Generator,
                device: torch.device) -> Mamba2Step | DeltaStep:
    """A window's inputs: the family's ``random_step`` of b x T rows, per-token fields reshaped to [b, T, ...]."""
    flat = family_of(dims).random_step(dims, batch * window, gen, device)
    return replace(flat, **{f.name: getattr(flat, f.name).unflatten(0, (batch, window)) for f in fields(flat)
                            if f.name not in flat.per_head_fields})


def rotate_gate_rings_(layer: GDNLayerCache, idx: torch.Tensor, words: list[int]) -> None:
    """Rotate the gate rings of rows ``idx`` so that the records from each cursor word's origin hold ``fill_rings_``'s
    cumulative log-gates in order (falling from the checkpoint); as written, from ring position 0, a history starting
    at origin o > 0 would wrap back to a higher gate (a growing decay)."""
    ring, slots = layer.g_ring.shape[2], idx.long()
    origin = torch.tensor([spec_cursor.unpack(w)[0] for w in words], device=idx.device)
    src = (torch.arange(ring, device=idx.device) - origin[:, None]) % ring  # position p holds record p - origin
    g = layer.g_ring[slots]
    layer.g_ring[slots] = g.gather(2, src.view(len(words), 1, ring, *(1,) * (g.dim() - 3)).expand_as(g))


def _tuned(tuning: Tuning | None) -> dict:
    """``tuning`` as the family's verify op and its plan take it (None: the op's default)."""
    return {} if tuning is None else {"tuning": tuning}


def _window_out(shape: BenchShape, batch: int, window: int, device: torch.device) -> torch.Tensor:
    return torch.empty(batch, window, shape.dims.heads, shape.dims.rows, dtype=torch.bfloat16, device=device)


def _replay_calls(shape: BenchShape, batch: int, sd: str, step: Mamba2Step | DeltaStep, accepted: torch.Tensor,
                  window: int, ring: int, n_pools: int, gen: torch.Generator, device: torch.device,
                  tuning: Tuning | None = None):
    fam, ops, tuned = family_of(shape.dims), SPEC_OPS[shape.family], _tuned(tuning)
    args, kwargs = step.op_args()
    out = _window_out(shape, batch, window, device)
    words = start_words(batch, window, ring)
    calls, tile = [], 0
    for _ in range(n_pools):
        layer = fam.new_cache(shape.dims, 1, batch + 1, buffer_len=ring, state_dtype=sd, device=device).layer(0)
        idx = slot_indices(batch, gen, device)
        layer.state.copy_(random_state(layer.slots, shape.dims, layer.state.dtype, gen, device))
        fill_rings_(layer, gen)
        if isinstance(layer, GDNLayerCache):  # KDA's too
            rotate_gate_rings_(layer, idx, words)
        layer.cursor.zero_()
        layer.cursor[idx.long()] = torch.tensor(words, dtype=torch.int32, device=device)
        tile = ops.verify_tile(layer, batch, window, **tuned)

        def call(layer=layer, idx=idx):
            ops.verify(layer, *args, **kwargs, state_batch_indices=idx, out=out, **tuned)
            spec.commit(layer, accepted, idx, window=window)
        calls.append(call)
    return calls, out, tile


def _per_draft_calls(shape: BenchShape, batch: int, sd: str, step: Mamba2Step | DeltaStep, accepted: torch.Tensor,
                     window: int, n_pools: int, gen: torch.Generator, device: torch.device):
    ops, dims = SPEC_OPS[shape.family], shape.dims
    args, kwargs = step.op_args()
    out = _window_out(shape, batch, window, device)
    calls, tile = [], 0
    for _ in range(n_pools):
        state = random_state(batch + 1, dims, parse_state_label(sd).format, gen, device)
        inter = torch.empty(batch, window, dims.heads, dims.rows, dims.cols, dtype=state.dtype, device=device)
        idx = slot_indices(batch, gen, device)
        tile = ops.per_draft_tile(state, batch)

        def call(state=state, inter=inter, idx=idx):
            ops.per_draft_verify(state, inter, *args, **kwargs, state_batch_indices=idx, out=out)
            ops.per_draft_commit(state, inter, accepted, idx)
        calls.append(call)
    return calls, out, tile


def _history_bytes(dims: SSMDims, records: float) -> float:
    """Ring bytes a verify reads of a history of ``records`` committed records: whole records; KDA (pre-decayed keys,
    every one of them under the benchmark's gates): their values and keys and one gate row, the last record's."""
    rec = core_bytes.record_bytes(dims, ACT_DTYPE)
    if not dims.per_channel_gate:
        return rec * records
    gate_row = core_bytes.gate_elems(dims) * core_bytes.GATE_BYTES
    return (rec - gate_row) * records + gate_row


def step_bytes(impl: str, dims: SSMDims, sd: str, window: int, ring: int, folds: float) -> float:
    """Bytes per row and verify step (the module docstring's model); ``ring`` and ``folds`` are the impl's own
    (ring length, folds per verify) where it keeps rings."""
    s = core_bytes.state_bytes(dims, parse_state_label(sd))
    io = window * core_bytes.io_bytes(dims, ACT_DTYPE)
    if impl in PER_DRAFT_COMMIT_STATES:
        return s * (1 + window + PER_DRAFT_COMMIT_STATES[impl]) + io
    mean_history = (ring - 2 * window) / 2
    return (s * (1 + folds) + _history_bytes(dims, mean_history) + core_bytes.record_bytes(dims, ACT_DTYPE) * window
            + io)


def run_spec_bench(families: list[str], models: list[str] | None, batches: list[int], windows: list[int],
                   state_dtype: str = "fp32", buffer_len: int = 16, peers: bool = True,
                   replays: int = timing.MIN_REPLAYS, seed: int = 0, log: Callable[[str], None] = print,
                   progress: Callable[[dict], None] | None = None) -> dict:
    """Time every (model, T, batch) case, with ``peers`` also the peers'; returns the results dict (``records`` of
    :class:`SpecRecord`, ``skipped``)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the speculative benchmark needs a CUDA device; torch.cuda.is_available() is False")
    if any(w < 1 or w > MAX_WINDOW for w in windows):
        raise ValueError(f"spec_tokens: expected 1..{MAX_WINDOW} tokens per verify, got {windows}")
    if not 1 <= buffer_len <= MAX_BUFFER_LEN or any(spec_cursor.ring_len(buffer_len, w) > MAX_BUFFER_LEN
                                                    for w in windows):
        raise ValueError(f"buffer_len: rings of L + T records must fit {MAX_BUFFER_LEN}, got L={buffer_len}, "
                         f"T={windows}")
    shapes = select_shapes(families, models)
    device = torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    copy_gbps = timing.copy_ceiling_gbps(device)
    l2 = timing.l2_bytes(device)
    log(f"{props.name}: copy ceiling {copy_gbps:.0f} GB/s")
    results = {"device": props.name, "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
               "copy_ceiling_gbps": copy_gbps, "l2_bytes": l2, "sm_count": props.multi_processor_count,
               "buffer_len": buffer_len, "torch": torch.__version__, "cuda": torch.version.cuda,
               "python": platform.python_version(), "peer_versions": peer_versions(), "records": [], "skipped": []}
    for shape in shapes:
        for window in windows:
            for batch in batches:
                results["records"] += [asdict(r) for r in _run_case(shape, batch, window, state_dtype, buffer_len,
                                                                    peers, replays, seed, copy_gbps, l2,
                                                                    results["skipped"], device, log)]
                if progress is not None:
                    progress(results)
    return results


def peer_ring_len(buffer_len: int, window: int) -> int:
    """Rings of FlashInfer's ``checkpointing_ssu`` peer: replay window L plus the T appended rows."""
    return buffer_len + window


def _peer_calls(impl: str, shape: BenchShape, batch: int, sd: str, step: Mamba2Step | DeltaStep,
                accepted: torch.Tensor, window: int, buffer_len: int, n_pools: int, gen: torch.Generator,
                device: torch.device):
    ring = peer_ring_len(buffer_len, window)
    starts = [spec_cursor.unpack(w) for w in start_words(batch, window, ring)]
    case = build_spec_peer(impl, shape, batch, sd, step, accepted, buffer_len, starts, n_pools, gen, device)
    return case.calls, case.outputs[0], 0


def _run_case(shape: BenchShape, batch: int, window: int, sd: str, buffer_len: int, peers: bool, replays: int,
              seed: int, copy_gbps: float, l2: int, skipped: list[dict], device: torch.device,
              log: Callable[[str], None]) -> list[SpecRecord]:
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed}/spec/{shape.model}/{sd}/{window}/{batch}".encode()))
    ring = spec_cursor.ring_len(buffer_len, window)
    step = window_step(shape.dims, batch, window, gen, device)
    pattern = torch.randint(1, window + 1, (batch,), generator=gen)
    accepted = pattern.to(torch.int32).to(device)
    mean_accept = float(pattern.float().mean())
    state = core_bytes.state_bytes(shape.dims, parse_state_label(sd))
    n_pools = timing.pools_for_cold_l2(int((batch + 1) * state * (1 + window)), l2)
    builders = {
        "replay_verify": lambda: _replay_calls(shape, batch, sd, step, accepted, window, ring, n_pools, gen, device),
        "per_draft_verify": lambda: _per_draft_calls(shape, batch, sd, step, accepted, window, n_pools, gen, device),
    }
    for impl in SPEC_PEERS if peers else ():
        builders[impl] = lambda i=impl: _peer_calls(i, shape, batch, sd, step, accepted, window, buffer_len, n_pools,
                                                    gen, device)
    rings = {"replay_verify": ring, "flashinfer_checkpointing_ssu": peer_ring_len(buffer_len, window)}
    out: list[SpecRecord] = []
    for impl, build in builders.items():
        try:
            calls, o, tile = build()
            us = timing.time_calls([c for _ in range(STEPS_PER_GRAPH) for c in calls], replays)
        except Exception as exc:  # a peer that cannot run is recorded; ours must run
            if impl in IMPLS:
                raise
            reason = str(exc) if isinstance(exc, PeerUnavailable) else f"error: {type(exc).__name__}: {exc}"
            skipped.append(dict(family=shape.family, model=shape.model, impl=impl, batch=batch, state_dtype=sd,
                                spec_tokens=window, reason=reason))
            log(f"  skip {impl} {shape.model} T={window} b={batch}: {reason}")
            _release()
            continue
        folds = folds_per_verify(pattern.tolist(), window, rings[impl]) if impl in rings else None
        nbytes = batch * step_bytes(impl, shape.dims, sd, window, rings.get(impl, 0), folds or 0.0)
        gbps = nbytes / (us * 1e-6) / 1e9
        rec = SpecRecord(shape.family, shape.model, impl, batch, sd, buffer_len, window, mean_accept, us, nbytes,
                         gbps, 100 * gbps / copy_gbps, folds, n_pools, STEPS_PER_GRAPH * n_pools,
                         bool(torch.isfinite(o.float()).all()), tile)
        out.append(rec)
        log(f"  {shape.model:22s} {sd} T={window} b={batch:<4d} {impl:28s} {us:9.2f} us {gbps:7.0f} GB/s "
            f"{rec.pct_of_copy:5.1f}% of copy")
        del calls, o
        _release()
    return out


def _release() -> None:
    gc.collect()
    torch.cuda.empty_cache()


def summary(results: dict) -> str:
    """A markdown table per (model, T, batch): replay vs per-draft µs per verify step and the speedup, then a column
    per peer that has records: its µs and the replay verify's speedup over it ("skipped" where it did not run)."""
    by = {(r["model"], r["spec_tokens"], r["batch"], r["impl"]): r for r in results["records"]}
    timed = [p for p in SPEC_PEERS if any(r["impl"] == p for r in results["records"])]
    lines = ["| model | T | batch | replay verify µs (% of copy) | per-draft µs (% of copy) | speedup |"
             + "".join(f" {p} µs (speedup) |" for p in timed),
             "|---|---|---|---|---|---|" + "---|" * len(timed)]
    for (model, T, batch, impl), rec in by.items():
        if impl != "replay_verify" or (model, T, batch, "per_draft_verify") not in by:
            continue
        base = by[(model, T, batch, "per_draft_verify")]
        peer_cells = [by.get((model, T, batch, p)) for p in timed]
        lines.append(f"| {model} | {T} | {batch} | {rec['median_us']:.1f} ({rec['pct_of_copy']:.0f}%) | "
                     f"{base['median_us']:.1f} ({base['pct_of_copy']:.0f}%) | "
                     f"{base['median_us'] / rec['median_us']:.2f}x |"
                     + "".join(" skipped |" if c is None else
                               f" {c['median_us']:.1f} ({c['median_us'] / rec['median_us']:.2f}x) |"
                               for c in peer_cells))
    return "\n".join(lines)
