"""The speculative verify benchmark's CPU-side parts (``bench kernels --spec``): FlashInfer's ring bookkeeping, the
peers' refusals, fla-core's peers against the float64 recurrence (on a CPU in Triton's interpreter, where Triton and
fla-core are installed), every family's window inputs, rings and verify calls (on the CPU references), the byte
model, the selected families and the summary table. The timing itself needs the GPU (docs/benchmarks.md)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from click.testing import CliRunner

from trtllm_replayssm.cli import bench_cmd
from trtllm_replayssm.core import spec_cursor
from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.samples import fill_rings_, slot_indices, window_token
from trtllm_replayssm.lab.bench import peers, spec
from trtllm_replayssm.lab.bench.shapes import BenchShape

CPU = torch.device("cpu")
NANO = BenchShape("nano", Mamba2Dims(nheads=96, head_dim=80, d_state=128, n_groups=8))
SMALL = BenchShape("small", Mamba2Dims(nheads=4, head_dim=32, d_state=32, n_groups=2))
GDN = BenchShape("gdn", GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=32))
KDA = BenchShape("kda", KDADims(num_heads=2, head_dim=64))
FLASHINFER_SPEC_PEERS = ("flashinfer_checkpointing_ssu", "flashinfer_ssu_mtp")


def test_checkpointing_bookkeeping_matches_a_hand_computed_sequence():
    """W = 6, T = 2 (R = 8), rows on slots 2 and 0: a row flushes when prev + T > W; slots 1 and 3 stay untouched."""
    ring_start = torch.tensor([0, 7, 5, 7], dtype=torch.int32)
    prev = torch.tensor([4, 7, 3, 7], dtype=torch.int32)
    slots = torch.tensor([2, 0])
    calls = [  # accepted (row 0, row 1) -> flushed, (ring_start, prev) of slot 2, of slot 0
        ((2, 1), (False, False), (5, 5), (0, 5)),
        ((1, 2), (True, True), (2, 1), (5, 2)),
        ((2, 2), (False, False), (2, 3), (5, 4)),
        ((1, 1), (False, False), (2, 4), (5, 5)),
        ((2, 1), (False, True), (2, 6), (2, 1)),
        ((1, 1), (True, False), (0, 1), (2, 2)),
    ]
    for accepted, flushed, slot2, slot0 in calls:
        flush = peers.advance_checkpointing_ring_(ring_start, prev, torch.tensor(accepted, dtype=torch.int32), slots,
                                                  tokens=2, max_window=6)
        assert flush.tolist() == list(flushed)
        assert (ring_start[2].item(), prev[2].item()) == slot2
        assert (ring_start[0].item(), prev[0].item()) == slot0
        assert (ring_start[[1, 3]].tolist(), prev[[1, 3]].tolist()) == ([7, 7], [7, 7])
        assert ring_start.dtype == prev.dtype == torch.int32


@pytest.mark.parametrize("window", [2, 4, 8])
def test_checkpointing_flushes_are_our_folds_at_ring_l_plus_t(window):
    """From the benchmark's staggered starts, FlashInfer's trackers stay valid (prev <= W, ring_start < R) and flush
    exactly when our cursor rule folds at R = L + T: the byte model's folds per verify hold for the peer."""
    batch, buffer_len, steps = 24, 16, 64
    ring = spec.peer_ring_len(buffer_len, window)
    pattern = torch.randint(1, window + 1, (batch,), generator=torch.Generator().manual_seed(window))
    starts = torch.tensor([spec_cursor.unpack(w) for w in spec.start_words(batch, window, ring)],
                          dtype=torch.int32)
    slots = torch.randperm(batch, generator=torch.Generator().manual_seed(1)) + 1
    ring_start = torch.zeros(batch + 1, dtype=torch.int32)
    prev = torch.zeros(batch + 1, dtype=torch.int32)
    ring_start[slots], prev[slots] = starts[:, 0], starts[:, 1]
    flushes = 0
    for _ in range(steps):
        flushes += int(peers.advance_checkpointing_ring_(ring_start, prev, pattern.to(torch.int32), slots, window,
                                                         buffer_len).sum())
        assert int(prev.max()) <= buffer_len and int(ring_start.max()) < ring
    assert flushes / (steps * batch) == pytest.approx(spec.folds_per_verify(pattern.tolist(), window, ring, steps))


def _build(impl: str, shape: BenchShape, max_window: int = 16, window: int = 4):
    """Build a spec peer on the CPU for `shape` (the refusals come before the window's inputs are read)."""
    step = spec.window_step(SMALL.dims, 2, window, torch.Generator().manual_seed(0), CPU)
    accepted = torch.ones(2, dtype=torch.int32)
    return peers.build_spec_peer(impl, shape, 2, "fp32", step, accepted, max_window, [(0, 0), (1, 1)], 1,
                                 torch.Generator().manual_seed(0), CPU)


def test_spec_peers_refuse_nano_and_other_families():
    with pytest.raises(peers.PeerUnavailable, match="head_dim 80"):
        _build("flashinfer_checkpointing_ssu", NANO)
    # head_dim 80 where FlashInfer 0.7.0.post1 is installed; without FlashInfer, its import fails first
    with pytest.raises(peers.PeerUnavailable, match="head_dim 80|import flashinfer.mamba failed"):
        _build("flashinfer_ssu_mtp", NANO)
    for impl in FLASHINFER_SPEC_PEERS:
        with pytest.raises(peers.PeerUnavailable, match="Mamba-2 kernel"):
            _build(impl, GDN)
    for impl, name in (("fla_gdn_mtp", "GDN"), ("fla_kda_mtp", "KDA")):
        with pytest.raises(peers.PeerUnavailable, match=f"{impl} is a {name} peer, not mamba2"):
            _build(impl, SMALL)
    with pytest.raises(ValueError, match="impl"):
        _build("vllm", SMALL)


@pytest.mark.parametrize("max_window, window", [(17, 4), (4, 8)])
def test_checkpointing_spec_peer_refuses_windows_outside_flashinfer_limits(max_window, window):
    with pytest.raises(peers.PeerUnavailable, match="T <= max_window <= 16"):
        _build("flashinfer_checkpointing_ssu", SMALL, max_window=max_window, window=window)


def test_step_bytes_of_the_peers():
    dims, T = SMALL.dims, 4
    s = dims.heads * dims.rows * dims.cols * 4
    ring = spec.peer_ring_len(16, T)
    assert spec.step_bytes("flashinfer_ssu_mtp", dims, "fp32", T, 0, 0.0) == \
        spec.step_bytes("per_draft_verify", dims, "fp32", T, 0, 0.0) + 2 * s
    for impl in ("fla_gdn_mtp", "fla_kda_mtp"):  # no commit copy: the next verify reads the accepted draft
        assert spec.step_bytes(impl, dims, "fp32", T, 0, 0.0) == \
            spec.step_bytes("per_draft_verify", dims, "fp32", T, 0, 0.0) - 2 * s
    assert spec.step_bytes("flashinfer_checkpointing_ssu", dims, "fp32", T, ring, 0.25) == \
        spec.step_bytes("replay_verify", dims, "fp32", T, ring, 0.25)


@pytest.mark.parametrize("shape, per_token", [
    (SMALL, {"x": (4, 32), "dt": (4,), "B": (2, 32), "C": (2, 32)}),
    (GDN, {"q": (2, 64), "k": (2, 64), "v": (4, 32), "a": (4,), "b": (4,)}),
    (KDA, {"q": (2, 64), "k": (2, 64), "v": (2, 64), "a": (2, 64), "b": (2,)}),
])
def test_window_step_has_per_token_fields_by_window_token(shape, per_token):
    step = spec.window_step(shape.dims, 3, 4, torch.Generator().manual_seed(0), CPU)
    flat = family_of(shape.dims).random_step(shape.dims, 1, torch.Generator().manual_seed(0), CPU)
    for name, tail in per_token.items():
        assert getattr(step, name).shape == (3, 4, *tail), name
    for name in step.per_head_fields:
        assert getattr(step, name).shape == getattr(flat, name).shape, name


@pytest.mark.parametrize("shape", [GDN, KDA], ids=["gdn", "kda"])
def test_rotated_gate_rings_fall_from_each_rows_origin(shape):
    """After the rotation, a row's gate records read from its origin (wrapping) are fill_rings_'s cumulative
    sequence: falling along the whole ring, so every history and window decays with a non-positive exponent."""
    batch, window, ring = 9, 2, spec_cursor.ring_len(4, 2)
    gen = torch.Generator().manual_seed(0)
    layer = family_of(shape.dims).new_cache(shape.dims, 1, batch + 1, buffer_len=ring, device=CPU).layer(0)
    idx = slot_indices(batch, gen, CPU)
    fill_rings_(layer, gen)
    written = layer.g_ring.clone()
    words = spec.start_words(batch, window, ring)
    spec.rotate_gate_rings_(layer, idx, words)
    assert {spec_cursor.unpack(w)[0] for w in words} == set(range(ring))  # every origin, wrapping included
    for slot, word in zip(idx.tolist(), words):
        origin = spec_cursor.unpack(word)[0]
        history = layer.g_ring[slot].roll(-origin, dims=1)
        assert torch.equal(history, written[slot])
        assert (history.diff(dim=1) < 0).all()
    assert torch.equal(layer.g_ring[0], written[0])  # the unused slot stays


@pytest.mark.parametrize("shape", [SMALL, GDN, KDA], ids=["mamba2", "gdn", "kda"])
def test_verify_calls_run_every_family_on_the_cpu_references(shape):
    """Both impls' calls (verify + commit, folds included) on the float32 references: the ops take the window's
    ``op_args()`` and the staggered cursor words."""
    batch, window, gen = 5, 3, torch.Generator().manual_seed(0)
    ring = spec_cursor.ring_len(8, window)
    step = spec.window_step(shape.dims, batch, window, gen, CPU)
    accepted = torch.randint(1, window + 1, (batch,), generator=gen).to(torch.int32)
    replay, out, _ = spec._replay_calls(shape, batch, "fp32", step, accepted, window, ring, 2, gen, CPU)
    for _ in range(4):
        for call in replay:
            call()
    assert out.shape == (batch, window, shape.dims.heads, shape.dims.rows) and torch.isfinite(out.float()).all()
    per_draft, out, _ = spec._per_draft_calls(shape, batch, "fp32", step, accepted, window, 1, gen, CPU)
    per_draft[0]()
    assert torch.isfinite(out.float()).all()


@pytest.mark.parametrize("shape, replay, per_draft", [
    # |S| = 4*32*32*4 = 16384; record: x 4*32*2 + B 2*32*2 + dt 4*4 = 400; I/O per token: x, y 2*4*32*2 + B, C
    # 2*2*32*2 + dt 16 + index 4 = 788
    (SMALL, 16384 * 1.25 + 400 * 6.5 + 400 * 2 + 2 * 788, 16384 * 5 + 2 * 788),
    # |S| = 4*32*64*4 = 32768; record: u 4*32*2 + k 2*64*2 + g 4*4 = 528; I/O: q, k 2*2*64*2 + v, o 2*4*32*2 + a, b
    # 2*4*2 + 4 = 1044
    (GDN, 32768 * 1.25 + 528 * 6.5 + 528 * 2 + 2 * 1044, 32768 * 5 + 2 * 1044),
    # |S| = 2*64*64*4 = 32768; record: u 2*64*2 + k 2*64*2 + g 2*64*4 = 1024, the history's without gates 512 and one
    # gate row 512; I/O: q, k, v, o 4*2*64*2 + g 2*64*2 + beta 2*2 + 4 = 1288
    (KDA, 32768 * 1.25 + 512 * 6.5 + 512 + 1024 * 2 + 2 * 1288, 32768 * 5 + 2 * 1288),
], ids=["mamba2", "gdn", "kda"])
def test_step_bytes_by_hand(shape, replay, per_draft):
    """fp32 state, T = 2, ring 17 (mean history (17 - 4) / 2 = 6.5 records), 0.25 folds per verify."""
    assert spec.step_bytes("replay_verify", shape.dims, "fp32", 2, 17, 0.25) == replay
    assert spec.step_bytes("per_draft_verify", shape.dims, "fp32", 2, 0, 0.0) == per_draft


def test_every_family_is_benchmarked(monkeypatch):
    """GDN and KDA models reach the case loop like Mamba-2's (no family skipped); a device is faked."""
    seen = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda d: SimpleNamespace(name="fake",
                                                                                       multi_processor_count=1))
    monkeypatch.setattr(spec.timing, "copy_ceiling_gbps", lambda d: 1.0)
    monkeypatch.setattr(spec.timing, "l2_bytes", lambda d: 1)
    monkeypatch.setattr(spec, "peer_versions", lambda: {})
    monkeypatch.setattr(spec, "_run_case", lambda shape, batch, window, *a: seen.append((shape.model, window)) or [])
    results = spec.run_spec_bench(["gdn", "kda"], None, [8], [4], log=lambda line: None)
    assert seen == [("qwen3.5-4b", 4), ("qwen3.5-122b", 4), ("kimi-linear-48b", 4), ("glm-5.3-flash", 4)]
    assert results["skipped"] == []


def test_spec_peers_refuse_other_families():
    """FlashInfer's peers are Mamba-2 kernels and each fla-core peer verifies one delta family: any other case is
    refused with the reason, before its window is read, and recorded as skipped; so is a stored state."""
    def peer_calls(impl: str, shape: BenchShape, state: str = "fp32"):
        step = spec.window_step(shape.dims, 2, 4, torch.Generator().manual_seed(0), CPU)
        return spec._peer_calls(impl, shape, 2, state, step, torch.ones(2, dtype=torch.int32), 4, 16, 1,
                                torch.Generator().manual_seed(0), CPU)

    for shape, other in ((GDN, "fla_kda_mtp"), (KDA, "fla_gdn_mtp")):
        for impl in FLASHINFER_SPEC_PEERS:
            with pytest.raises(peers.PeerUnavailable, match=f"Mamba-2 kernel, not {shape.family}"):
                peer_calls(impl, shape)
        with pytest.raises(peers.PeerUnavailable, match=f"{other} is a {other[4:7].upper()} peer, not {shape.family}"):
            peer_calls(other, shape)
        with pytest.raises(peers.PeerUnavailable, match="has no nvfp4 state"):
            peer_calls(f"fla_{shape.family}_mtp", shape, "nvfp4")


def _record(impl: str, us: float, batch: int = 8) -> dict:
    return dict(model="super", spec_tokens=4, batch=batch, impl=impl, median_us=us, pct_of_copy=50.0)


def test_summary_has_a_column_per_timed_peer():
    records = [_record("replay_verify", 10.0), _record("per_draft_verify", 30.0),
               _record("flashinfer_checkpointing_ssu", 20.0),
               _record("replay_verify", 40.0, batch=256), _record("per_draft_verify", 80.0, batch=256)]
    lines = spec.summary({"records": records}).splitlines()
    assert lines[0].endswith("| speedup | flashinfer_checkpointing_ssu µs (speedup) |")
    assert "flashinfer_ssu_mtp" not in lines[0]  # no records: no column
    assert lines[1].count("---") == 7
    assert lines[2].endswith("| 3.00x | 20.0 (2.00x) |")
    assert lines[3].endswith("| 2.00x | skipped |")
    assert spec.summary({"records": records[:2]}).splitlines()[0].endswith("| speedup |")


@pytest.mark.parametrize("flag, expected", [("--peers", True), ("--no-peers", False)])
def test_spec_cli_passes_peers_through(monkeypatch, tmp_path, flag, expected):
    seen = {}

    def fake_run(*args, **kwargs):
        seen.update(kwargs)
        return {"records": []}

    monkeypatch.setattr(spec, "run_spec_bench", fake_run)
    monkeypatch.setattr(bench_cmd, "_gpu_run_output", lambda command, output, stem: tmp_path / "spec.json")
    result = CliRunner().invoke(bench_cmd.bench_cmd, ["kernels", "--spec", "4", "--family", "mamba2", flag])
    assert result.exit_code == 0, result.output
    assert seen["peers"] is expected


@pytest.fixture(scope="module")
def fla_device() -> torch.device:
    """Where fla-core's Triton kernels run: the GPU, else a CPU in Triton's interpreter (tests/conftest.py turns it
    on); skips without fla-core."""
    pytest.importorskip("fla.ops.kda.fused_recurrent")
    return torch.device("cuda") if torch.cuda.is_available() else CPU


@pytest.mark.parametrize("shape", [GDN, KDA], ids=["gdn", "kda"])
def test_fla_per_draft_peer_verifies_like_the_float64_recurrence(shape, fla_device):
    """fla-core's per-draft verify as the benchmark calls it, twice: each verify starts from the state after the
    previous one's accepted draft, writes the state after every window token to the row's draft slots and outputs
    every token as the float64 recurrence does (GDN through the KDA kernel with its gate repeated along K); slot 0
    is never touched."""
    batch, window, device = 3, 3, fla_device
    gen = torch.Generator().manual_seed(11)
    step = spec.window_step(shape.dims, batch, window, gen, device)
    accepted = torch.tensor([1, 3, 2], dtype=torch.int32, device=device)
    case = peers.build_spec_peer(f"fla_{shape.family}_mtp", shape, batch, "fp32", step, accepted, 16, [], 1, gen,
                                 device)
    state, drafts = case.calls[0].__defaults__
    reference = family_of(shape.dims).reference_step
    start = drafts[torch.arange(batch), accepted.long() - 1].long()  # where the previous verify left each row
    for _ in range(2):
        before = state.double().clone()
        s = before[start]
        case.calls[0]()
        for t in range(window):
            out, s = reference(s, window_token(step, t))
            torch.testing.assert_close(case.outputs[0][:, t].double(), out, rtol=2e-2, atol=2e-2)
            torch.testing.assert_close(state[drafts[:, t].long()].double(), s, rtol=1e-4, atol=1e-5)
        assert torch.equal(state[0].double(), before[0])


@pytest.mark.parametrize("shape", [GDN, KDA], ids=["gdn", "kda"])
def test_fla_decode_peers_step_like_the_float64_recurrence(shape, fla_device):
    """The standard-decode fla-core peers as ``bench kernels`` calls them compute our layer's step: GDN's public API
    (out of place, a new fp32 state), KDA's pooled kernel (in place at the rows' slots)."""
    batch, device = 3, fla_device
    gen = torch.Generator().manual_seed(12)
    step = family_of(shape.dims).random_step(shape.dims, batch, gen, device)
    case = peers.build_peer(f"fla_{shape.family}", shape, batch, "fp32", step, 1, 16, gen, device)
    state, *slots = case.calls[0].__defaults__
    before = state.double().clone()
    rows = slots[0].long() if slots else torch.arange(batch, device=device)
    out, new = family_of(shape.dims).reference_step(before[rows], step)
    result = case.calls[0]()
    if slots:  # in place
        got_out, got_state = case.outputs[0][:, 0], state[rows]
        assert torch.equal(state[0].double(), before[0])
    else:
        got_out, got_state = result[0][:, 0], result[1]
    torch.testing.assert_close(got_out.double(), out, rtol=2e-2, atol=2e-2)
    torch.testing.assert_close(got_state.double(), new, rtol=1e-4, atol=1e-5)
