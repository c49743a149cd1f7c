"""Benchmark case builders for our ops on CPU (the ops' reference fallback): staggered cursors, whole L-cycles,
slot pools of batch + 1 with a random permutation, the sample inputs, the runner's bookkeeping."""
from __future__ import annotations

import pytest
import torch

from trtllm_replayssm.core import byte_model as core
from trtllm_replayssm.core.dims import GDNDims, KDADims, Mamba2Dims
from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.samples import delta_step, mamba2_step, slot_indices
from trtllm_replayssm.lab.bench import ours
from trtllm_replayssm.lab.bench.shapes import BenchShape

CPU = torch.device("cpu")
TINY = {
    "mamba2": BenchShape("tiny", Mamba2Dims(nheads=4, head_dim=8, d_state=32, n_groups=2)),
    "gdn": BenchShape("tiny", GDNDims(num_k_heads=2, num_v_heads=4, head_k_dim=64, head_v_dim=32)),
    "kda": BenchShape("tiny", KDADims(num_heads=2, head_dim=64)),
}


def _step(shape: BenchShape, batch: int, gen: torch.Generator):
    return family_of(shape.dims).random_step(shape.dims, batch, gen, CPU)


def _cursors(case) -> list[torch.Tensor]:
    return [fn.__defaults__[0].cursor.clone() for fn in case.calls]  # each call's default args: its layer first


def test_slot_indices_are_a_permutation_without_slot_0():
    idx = slot_indices(7, torch.Generator().manual_seed(1), CPU)
    assert idx.dtype == torch.int32
    assert sorted(idx.tolist()) == list(range(1, 8))
    with pytest.raises(ValueError, match="batch"):
        slot_indices(0, torch.Generator(), CPU)


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_replay_case_runs_whole_cycles_from_staggered_cursors(family):
    shape, batch, L = TINY[family], 6, 4
    gen = torch.Generator().manual_seed(0)
    case = ours.replay_case(shape, batch, "fp32", _step(shape, batch, gen), 2, L, "replay", gen, CPU)
    assert case.plan["mode"] == "replay"
    start = _cursors(case)
    for cur in start:
        assert int(cur[0]) == 0  # slot 0 is never used
        assert sorted(cur[1:].tolist()) == sorted(r % L for r in range(batch))
    for _ in range(L):  # one whole cycle: every row visits every cursor value once and returns
        for fn in case.calls:
            fn()
    assert all(torch.equal(a, b) for a, b in zip(start, _cursors(case)))
    assert bool(torch.isfinite(case.outputs[0].float()).all())


@pytest.mark.parametrize("family", ["mamba2", "gdn", "kda"])
def test_flush_mode_and_baseline_cases(family):
    shape, batch = TINY[family], 3
    gen = torch.Generator().manual_seed(2)
    step = _step(shape, batch, gen)
    flush = ours.replay_case(shape, batch, "bf16", step, 1, 4, "flush", gen, CPU)
    assert flush.plan["mode"] == "flush"
    flush.calls[0]()
    assert not _cursors(flush)[0].any()  # every row flushed: all cursors back to 0
    base = ours.baseline_case(shape, batch, "bf16", step, 2, gen, CPU)
    assert base.plan["mode"] == "baseline"
    before = base.calls[0].__defaults__[0].clone()  # the pool's state tensor
    base.calls[0]()
    after = base.calls[0].__defaults__[0]
    assert torch.equal(before[0], after[0])  # slot 0 untouched
    assert not torch.equal(before[1:], after[1:])  # used slots updated
    assert bool(torch.isfinite(base.outputs[0].float()).all())


def test_input_generators_shapes():
    gen = torch.Generator().manual_seed(0)
    m = mamba2_step(TINY["mamba2"].dims, 3, gen, CPU)
    assert m.x.shape == (3, 4, 8) and m.dt.shape == (3, 4) and m.B.shape == (3, 2, 32) and m.A.max() <= -1.0
    delta = torch.nn.functional.softplus(m.dt_bias)
    assert 0.9e-3 <= float(delta.min()) and float(delta.max()) <= 1.1e-1
    k = delta_step(TINY["kda"].dims, 3, gen, CPU)
    assert k.a.shape == (3, 2, 64) and k.dt_bias.shape == (2, 64) and k.b.shape == (3, 2)
    g = delta_step(TINY["gdn"].dims, 3, gen, CPU)
    assert g.a.shape == (3, 4) and g.q.shape == (3, 2, 64) and g.v.shape == (3, 4, 32)
    assert all(float(t.abs().sum()) > 0 for t in (m.x, m.B, k.q, k.a, g.v))  # never zeros


def test_peer_adapters_report_unavailability(monkeypatch, tmp_path):
    from trtllm_replayssm.lab.bench import peers

    monkeypatch.delitem(__import__("sys").modules, "mamba_ssm", raising=False)
    monkeypatch.setenv(peers.MAMBA_SSM_SRC_ENV, str(tmp_path / "absent"))
    with pytest.raises(peers.PeerUnavailable, match="mamba_ssm source not found"):
        peers._import_mamba_ssm_ssu()
    gen = torch.Generator().manual_seed(0)
    step = _step(TINY["gdn"], 2, gen)
    with pytest.raises(peers.PeerUnavailable, match="Mamba-2 kernel"):
        peers.build_peer("flashinfer_ssu", TINY["gdn"], 2, "fp32", step, 1, 16, gen, CPU)
    nano = BenchShape("nano", Mamba2Dims(nheads=96, head_dim=80, d_state=128, n_groups=8))
    with pytest.raises(peers.PeerUnavailable, match="head_dim 80"):
        peers.build_peer("flashinfer_checkpointing_ssu", nano, 2, "fp32", _step(TINY["mamba2"], 2, gen), 1, 16,
                         gen, CPU)
    with pytest.raises(ValueError, match="impl"):
        peers.build_peer("vllm", TINY["gdn"], 2, "fp32", step, 1, 16, gen, CPU)


def test_checkpointing_peer_fp8_state_is_our_fp8_layout():
    """FlashInfer checkpointing_ssu's FP8 state: E4M3 codes with an fp32 decode scale per (slot, head, state row),
    within one E4M3 rounding of the random values; plain states carry no scale; other stored formats are refused."""
    from trtllm_replayssm.lab.bench import peers

    shape, gen = TINY["mamba2"], torch.Generator().manual_seed(0)
    codes, scale = peers._checkpointing_state(shape, 3, "fp8", gen, CPU)
    d = shape.dims
    assert codes.dtype == torch.float8_e4m3fn and codes.shape == (3, d.heads, d.rows, d.cols)
    assert scale.dtype == torch.float32 and scale.shape == (3, d.heads, d.rows)
    values = codes.float() * scale[..., None]
    assert values.abs().amax(dim=-1).sub(448 * scale).abs().max() <= 1e-6 * scale.max()  # each row's amax is 448
    state, none = peers._checkpointing_state(shape, 3, "bf16", gen, CPU)
    assert state.dtype == torch.bfloat16 and none is None
    for label in ("nvfp4", "fp8/dual/fp32", "fp8+sr"):
        with pytest.raises(peers.PeerUnavailable, match=f"no {label.replace('+', '[+]')} state"):
            peers._checkpointing_fp8(label)


@pytest.mark.gpu
def test_kernel_bench_end_to_end_on_gpu():
    from trtllm_replayssm.lab.bench.kernels import KernelBenchConfig, run_kernel_bench
    from trtllm_replayssm.lab.bench.report import summary_markdown

    config = KernelBenchConfig(families=["mamba2", "gdn"], models=["nemotron-3-super-120b", "qwen3.5-4b"],
                               batches=[8], state_dtypes=["fp32"], peers=False)
    results = run_kernel_bench(config, log=lambda _msg: None)
    assert 1000 < results["copy_ceiling_gbps"] < 20000
    recs = results["records"]
    assert not results["skipped"], results["skipped"]
    assert {(r["model"], r["impl"], r["mode"]) for r in recs} == {
        (m, "replay", mode) for m in ("nemotron-3-super-120b", "qwen3.5-4b")
        for mode in ("replay", "fused", "flush", "auto")
    } | {(m, "baseline", None) for m in ("nemotron-3-super-120b", "qwen3.5-4b")}
    for r in recs:
        assert r["median_us"] > 0 and r["finite"] is True
        assert r["calls_per_graph"] == 16 * r["n_pools"] and r["n_pools"] >= 4
        assert r["plan"]["mode"] in ("replay", "fused", "flush", "baseline") and r["plan"]["rows_per_cta"] > 0
        if r["impl"] == "replay":
            assert r["resolved_mode"] == r["plan"]["mode"]
    assert "speed-up vs baseline" in summary_markdown(results)


def test_runner_records_what_the_op_ran_and_skips_unavailable_peers():
    """The runner's bookkeeping with a timer that runs every call once (CPU has no CUDA graphs)."""
    from trtllm_replayssm.lab.bench import byte_model, kernels

    ran = []

    def one_pass(calls, replays):
        for fn in calls:
            fn()
        ran.append(len(calls))
        return 10.0

    config = kernels.KernelBenchConfig(families=["mamba2"], batches=[4], state_dtypes=["fp32"], buffer_len=4,
                                       peer_impls=("flashinfer_ssu",))
    shape, skipped = TINY["mamba2"], []
    recs = kernels._run_case(config, shape, "fp32", 4, 2000.0, 1000, skipped, CPU, lambda _m: None, one_pass)
    assert [(r.impl, r.mode) for r in recs] == [("replay", "replay"), ("replay", "fused"), ("replay", "flush"),
                                                  ("replay", "auto"), ("baseline", None)]
    assert [r.resolved_mode for r in recs] == ["replay", "replay", "flush", "replay", None]  # CPU: the reference
    assert [r.plan["mode"] for r in recs] == ["replay", "replay", "flush", "replay", "baseline"]
    n_pools = recs[0].n_pools
    assert n_pools == 4 and ran == [4 * n_pools] * 5  # L steps x pools per graph
    flush_bytes = 4 * core.baseline_bytes(shape.dims, "fp32", byte_model.ACT_DTYPE)
    assert recs[2].bytes_per_call == flush_bytes and recs[4].bytes_per_call == flush_bytes
    replay_bytes = 4 * core.replay_bytes(shape.dims, "fp32", byte_model.ACT_DTYPE, 4)
    assert recs[0].bytes_per_call == replay_bytes and recs[1].bytes_per_call == replay_bytes
    assert recs[0].model_gbps == pytest.approx(recs[0].bytes_per_call / 10e-6 / 1e9)
    assert recs[0].pct_of_copy == pytest.approx(100 * recs[0].model_gbps / 2000.0)
    assert all(r.finite for r in recs)
    assert len(skipped) == 1 and skipped[0]["impl"] == "flashinfer_ssu" and skipped[0]["model"] == "tiny"
    # without FlashInfer: its import failed; with it: the tiny head_dim it cannot compile
    assert "flashinfer" in skipped[0]["reason"].lower()


@pytest.mark.parametrize("label", ["nvfp4/dual/fp16", "fp8+sr"])
def test_runner_times_stored_checkpoints(label):
    """Quantized / dual / stochastically rounded Mamba-2 state: our replay and baseline (not with SR), the spec's
    fields in every record, the peers skipped with the reason (only FlashInfer's checkpointing_ssu has a stored
    state, FP8 shared); labels outside Mamba-2 are refused."""
    from trtllm_replayssm.core.formats import parse_state_label
    from trtllm_replayssm.lab.bench import byte_model, kernels

    def one_pass(calls, replays):
        for fn in calls:
            fn()
        return 10.0

    spec = parse_state_label(label)
    config = kernels.KernelBenchConfig(families=["mamba2"], batches=[4], state_dtypes=[label], buffer_len=4)
    shape, skipped = TINY["mamba2"], []
    recs = kernels._run_case(config, shape, label, 4, 2000.0, 1000, skipped, CPU, lambda _m: None, one_pass)
    impls = [r.impl for r in recs]
    assert impls == ["replay"] * 4 + ([] if spec.stochastic_rounding else ["baseline"])  # replay, fused, flush, auto
    for r in recs:
        assert (r.state_dtype, r.state_format, r.state_mode, r.master_format, r.stochastic_rounding) == (
            label, spec.format, spec.mode, spec.master, spec.stochastic_rounding)
        assert r.finite
    assert recs[0].bytes_per_call == 4 * core.replay_bytes(shape.dims, spec, byte_model.ACT_DTYPE, 4)
    reasons = {s["impl"]: s["reason"] for s in skipped}
    assert reasons["flashinfer_ssu"] == reasons["mamba_ssm_ssu"].replace("mamba_ssm_ssu", "flashinfer_ssu") == (
        f"flashinfer_ssu has no {label} state")
    assert "flashinfer_checkpointing_ssu" in reasons  # its only stored state is fp8 (and never this tiny head_dim)
    assert ("baseline" in reasons) == spec.stochastic_rounding


@pytest.mark.parametrize("family", ["mamba2", "gdn"])
@pytest.mark.parametrize("neighbour", ["plain", "conv"])
def test_runner_times_each_call_after_its_neighbour_and_subtracts_it(family, neighbour):
    """``neighbour``: every call of the graph follows that kernel (a plain elementwise one, or our conv1d step over
    the layer's conv channels), whose own time (a graph of it alone) is recorded and subtracted."""
    from trtllm_replayssm.lab.bench import kernels

    graphs = []

    def one_pass(calls, replays):
        for fn in calls:
            fn()
        graphs.append(len(calls))
        return 3.0 if len(graphs) == 1 else 10.0  # the neighbour alone first, then pairs of launches

    config = kernels.KernelBenchConfig(families=[family], batches=[2], state_dtypes=["fp32"], buffer_len=4,
                                       peers=False, neighbour=neighbour)
    recs = kernels._run_case(config, TINY[family], "fp32", 2, 2000.0, 1000, [], CPU, lambda _m: None, one_pass)
    n = 4 * recs[0].n_pools
    assert graphs == [n] + [2 * n] * len(recs)
    assert all(r.neighbour == neighbour and r.neighbour_us == 3.0 and r.median_us == 2 * 10.0 - 3.0 for r in recs)
    with pytest.raises(ValueError, match="neighbour"):
        kernels.KernelBenchConfig(families=[family], neighbour="norm")


def test_runner_plans_our_cases_with_the_configs_tuning(monkeypatch):
    """``tuning`` (``bench kernels --served-launch``: the TensorRT-LLM module's SERVING_TUNING) reaches every replay
    and baseline case the runner builds, and the CLI flag sets it."""
    from click.testing import CliRunner

    from trtllm_replayssm.cli import bench_cmd
    from trtllm_replayssm.lab.bench import kernels, ours
    from trtllm_replayssm.serving.trtllm.model_cache import SERVING_TUNING

    seen = []
    for name in ("replay_case", "baseline_case"):
        real = getattr(ours, name)
        monkeypatch.setattr(ours, name, lambda *a, _real=real, **kw: seen.append(a[-1]) or _real(*a, **kw))
    config = kernels.KernelBenchConfig(families=["mamba2"], batches=[2], state_dtypes=["fp32"], buffer_len=4,
                                       peers=False, tuning=SERVING_TUNING)
    recs = kernels._run_case(config, TINY["mamba2"], "fp32", 2, 2000.0, 1000, [], CPU, lambda _m: None,
                             lambda calls, replays: 1.0)
    assert len(seen) == len(recs) == 5 and all(t is SERVING_TUNING for t in seen)
    assert not SERVING_TUNING.programmatic_state

    configs = []

    def capture(config, **_kw):  # the CLI's config; the run itself needs a GPU
        configs.append(config)
        raise SystemExit(0)

    monkeypatch.setattr(kernels, "run_kernel_bench", capture)
    monkeypatch.setattr(bench_cmd, "_gpu_run_output", lambda command, output, stem: output)
    for flags, expected in (([], ours.DEFAULT_TUNING), (["--served-launch"], SERVING_TUNING)):
        CliRunner().invoke(bench_cmd.bench_cmd, ["kernels", "--family", "mamba2", "--no-peers", *flags])
        assert configs.pop().tuning is expected
    result = CliRunner().invoke(bench_cmd.bench_cmd, ["kernels", "--spec", "4", "--served-launch"])
    assert result.exit_code != 0 and "--served-launch: not with --spec" in result.output


def test_flashinfer_prebuilt_module_list():
    """The prebuilt FlashInfer modules: both ops at T = 1 with fp32 and bf16 state, checkpointing_ssu also with its
    FP8 state (T = 1 only), fp32 alone for T > 1; ``state_dtypes`` keeps those dtypes' modules only."""
    from trtllm_replayssm.lab.bench.flashinfer_aot import CheckpointingSsuModule, SsuModule, benchmark_modules

    mods = benchmark_modules((1, 4))
    fp8 = [m for m in mods if m.state_dtype == torch.float8_e4m3fn]
    assert fp8 == [CheckpointingSsuModule(torch.float8_e4m3fn, dim=64, nheads=128, ngroups=8, tokens=1)]
    assert {(type(m), m.tokens) for m in mods if m.state_dtype == torch.bfloat16} == {(SsuModule, 1),
                                                                                     (CheckpointingSsuModule, 1)}
    assert all(m.state_dtype == torch.float32 for m in mods if m.tokens == 4) and len(mods) == 7
    assert benchmark_modules((1, 4), (torch.float8_e4m3fn,)) == fp8
    with pytest.raises(ValueError, match="tokens"):
        benchmark_modules((0,))


@pytest.mark.parametrize("label", ["nvfp4/dual/fp16", "fp8/dual/fp32+sr"])
def test_cases_take_state_labels(label):
    shape, batch = TINY["mamba2"], 3
    gen = torch.Generator().manual_seed(4)
    step = _step(shape, batch, gen)
    case = ours.replay_case(shape, batch, label, step, 1, 4, "flush", gen, CPU)
    assert case.calls[0].__defaults__[0].spec.label == label
    case.calls[0]()
    assert bool(torch.isfinite(case.outputs[0].float()).all())
    with pytest.raises(ValueError, match="state_dtype"):
        ours.replay_case(shape, batch, "nvfp4/shared/fp16", step, 1, 4, "flush", gen, CPU)


@pytest.mark.gpu
def test_fla_gdn_pooled_steps_like_fla_gdn():
    """The pooled GDN peer (fla-core's pooled KDA kernel, the head's gate repeated along K) takes the same step as
    fla-core's public GDN API from the same states: outputs and the states written in its pool."""
    pytest.importorskip("fla")
    from trtllm_replayssm.lab.bench import peers
    from trtllm_replayssm.lab.bench.shapes import shape_from_preset

    dev, gen = torch.device("cuda"), torch.Generator().manual_seed(0)
    shape, batch = shape_from_preset("qwen3.5-4b"), 5
    step = family_of(shape.dims).random_step(shape.dims, batch, gen, dev)
    pooled = peers.build_peer("fla_gdn_pooled", shape, batch, "fp32", step, 1, 16, gen, dev)
    state, slots = pooled.calls[0].__defaults__  # the pool (batch + 1 slots) and the rows' slots
    before = state[slots.long()].clone()
    pooled.calls[0]()
    fn = peers._import("fla.ops.gated_delta_rule").fused_recurrent_gated_delta_rule
    o, final = fn(step.q[:, None], step.k[:, None], step.v[:, None], g=step.a[:, None], beta=step.b[:, None],
                  initial_state=before, output_final_state=True, use_qk_l2norm_in_kernel=True,
                  use_gate_in_kernel=True, A_log=step.A_log, dt_bias=step.dt_bias, use_beta_sigmoid_in_kernel=True,
                  state_v_first=True)
    out = pooled.outputs[0]
    assert (out.float() - o.float()).abs().max() <= 2e-2 * o.float().abs().max()
    assert torch.allclose(state[slots.long()], final.float(), rtol=1e-4, atol=1e-5)
    assert not torch.equal(state[slots.long()], before)
