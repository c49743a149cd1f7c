"""CPU: launch plans as values. The planners reproduce the recorded plans of the H200 (every benchmark model, dtype
pair, batch, ring length and mode), tuning is passed in, ops refuse plans made for other shapes, and the shared
planner steps (adaptive mode, fold buffer, claimed tail, programmatic prep) follow their rules."""
import gzip
import json
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from trtllm_replayssm.core import plans
from trtllm_replayssm.core.cache import ReplayStateCache
from trtllm_replayssm.core.crossovers import Crossover
from trtllm_replayssm.core.families import FAMILIES, family_of
from trtllm_replayssm.core.formats import parse_state_label, state_spec
from trtllm_replayssm.core.dims import Mamba2Dims
from trtllm_replayssm.core.layouts import (GDN_PREP_MAX_GROUP, delta_fold_bytes, delta_fused_bytes, delta_stage_bytes,
                                           delta_verify_stage_bytes, key_ring_dtype, mamba2_stream_records_bytes)
from trtllm_replayssm.core.ops import delta, launch, mamba2, mamba2_spec
from trtllm_replayssm.core.plans import Device, Tuning
from trtllm_replayssm.serving.presets import get_preset

H200 = Device(132, 9)
RECORDED = Path(__file__).parent / "fixtures" / "launch_plans_h200.json.gz"
# recorded auto cases that the measured crossover entries of programmatic launches send to another mode (22 (model,
# activation dtype, batch) cases x 2 ring lengths)
MOVED_BY_THE_CROSSOVERS = 44
# recorded baseline and flush cases whose row tile the decode state kernels' rule (DECODE_MIN_CTAS_PER_SM) changed
RETILED_BY_THE_DECODE_TILE_RULE = 768
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _layer(dims, state_dtype, act_dtype, L, slots=2):
    return family_of(dims).new_cache(dims, 1, slots, buffer_len=L, state_dtype=state_dtype, act_dtype=act_dtype,
                                     device="cpu").layer(0)


def _launches(dims, plan, state_dtype, act_dtype):
    """The launches of ``plan`` as the recorded planner logged them."""
    fam = family_of(dims)
    if fam.name == "mamba2":
        config = mamba2.kernel_config(dims.head_dim, dims.d_state, state_dtype, act_dtype, plan.rows_per_cta)
        names = mamba2.KERNELS
    else:
        config = delta.kernel_config(dims.per_channel_gate, dims.cols, dims.rows, state_dtype, act_dtype,
                                     plan.rows_per_cta)
        names = delta.KERNELS
    rows = []
    for step in launch.plan_launches(plans.Launch.from_words(plan.words)):
        main = step.kernel == "main"
        rows.append(dict(config=config.name, kernel=names[step.kernel], grid=list(step.grid), block=list(step.block),
                         shared=step.shared, programmatic=step.programmatic, stages=plan.stages if main else 0,
                         stage_bytes=plan.stage_bytes if main else 0, fold_bytes=plan.fold_bytes if main else 0,
                         tail_start=plan.tail_start if main else 0))
    return rows


def test_planners_reproduce_the_recorded_h200_plans(monkeypatch):
    """Every recorded plan of every mode. An ``auto`` case whose batch the crossover table now sends to another mode
    (tests/test_crossovers.py covers the switch) is compared in the recorded mode; their number is pinned."""
    monkeypatch.delenv(plans.PREP_PDL_ENV, raising=False)
    monkeypatch.delenv(plans.ADAPTIVE_THRESHOLD_ENV, raising=False)
    cases = json.loads(gzip.open(RECORDED, "rt").read())["cases"]
    assert len(cases) == 1920
    moved = retiled = 0
    for case in cases:
        dims = get_preset(case["model"]).ssm_dims
        sd, ad = DTYPES[case["state_dtype"]], DTYPES[case["act_dtype"]]
        fam = family_of(dims)
        if case["mode"] == "baseline":
            state = torch.empty(2, dims.heads, dims.rows, dims.cols, dtype=sd)
            plan = fam.state_update_plan(state, case["batch"], ad, device=H200)
        else:
            layer = _layer(dims, sd, ad, case["L"])
            plan = fam.replay_plan(layer, case["batch"], case["mode"], device=H200)
            recorded = "replay" if len(case["launches"]) == 2 else "flush"
            if case["mode"] == "auto" and plan.mode != recorded:
                moved += 1
                plan = fam.replay_plan(layer, case["batch"], recorded, device=H200)
        if plan.mode != "replay":  # compared with the recorded tile (test_decode_state_tiles covers the rule)
            tile = dims.rows // case["launches"][0]["grid"][0]
            if plan.rows_per_cta != tile:
                retiled += 1
                plan = replace(plan, rows_per_cta=tile, grid=(dims.rows // tile, *plan.grid[1:]))
        expected = case["launches"]
        if plan.mode != "replay":  # recorded when the state kernels still launched plainly
            expected = [dict(expected[0], programmatic=True)]
        assert _launches(dims, plan, sd, ad) == expected, case
    assert moved == MOVED_BY_THE_CROSSOVERS
    assert retiled == RETILED_BY_THE_DECODE_TILE_RULE


def test_tuning_is_passed_in_not_patched():
    dims = get_preset("qwen3.5-4b").ssm_dims
    layer = _layer(dims, torch.float32, torch.bfloat16, 16)
    default = FAMILIES["gdn"].replay_plan(layer, 256, "replay", device=H200)
    tuned = FAMILIES["gdn"].replay_plan(layer, 256, "replay", Tuning(rows_per_cta=8, ctas_per_sm=1, stages=2,
                                                                    tail_fraction=1.0), device=H200)
    assert (tuned.rows_per_cta, tuned.grid, tuned.stages) == (8, (132, 1, 1), 2)
    assert tuned.tail_start == 132  # everything after the first wave is claimed
    assert default.rows_per_cta != 8 and default.tail_fraction == delta.TAIL_FRACTION
    none = FAMILIES["gdn"].replay_plan(layer, 256, "replay", Tuning(tail_fraction=None), device=H200)
    assert none.tail_start == none.num_tiles  # all round-robin
    below = FAMILIES["gdn"].replay_plan(layer, 256, "auto", Tuning(adaptive_threshold=10**6), device=H200)
    assert below.mode == "fused"  # below the tuned replay threshold: the fp32 GDN entry's fused band
    with pytest.raises(ValueError, match="rows_per_cta"):
        FAMILIES["gdn"].replay_plan(layer, 256, "replay", Tuning(rows_per_cta=6), device=H200)
    with pytest.raises(ValueError, match="stages"):
        Tuning(stages=1)
    with pytest.raises(ValueError, match="tail_fraction"):
        Tuning(tail_fraction=1.5)


def test_ops_refuse_a_plan_made_for_another_call():
    dims = get_preset("tiny-qwen").ssm_dims
    layer = _layer(dims, torch.float32, torch.float32, 4, slots=5)
    step = FAMILIES["gdn"].random_step(dims, 3, torch.Generator().manual_seed(0), "cpu", torch.float32)
    args, _ = step.op_args()
    wrong_batch = FAMILIES["gdn"].replay_plan(layer, 2)
    with pytest.raises(ValueError, match="plan: made for"):
        FAMILIES["gdn"].replay_decode(layer, *args, plan=wrong_batch)
    with pytest.raises(ValueError, match="disagrees"):
        FAMILIES["gdn"].replay_decode(layer, *args, mode="flush", plan=FAMILIES["gdn"].replay_plan(layer, 3))
    with pytest.raises(TypeError, match="LaunchPlan"):
        FAMILIES["gdn"].replay_decode(layer, *args, plan=[0] * 14)


def test_adaptive_mode_rules(monkeypatch):
    monkeypatch.delenv(plans.ADAPTIVE_THRESHOLD_ENV, raising=False)
    t = Tuning()
    assert plans.resolve_mode("flush", 10**6, True, 8, H200, t) == "flush"
    assert plans.resolve_mode("replay", 1, False, 8, H200, t) == "replay"
    assert plans.resolve_mode("auto", 1, True, 8, plans.CPU, t) == "replay"  # the CPU reference
    assert plans.resolve_mode("auto", 8 * 132 - 1, True, 8, H200, t) == "flush"
    assert plans.resolve_mode("auto", 8 * 132, True, 8, H200, t) == "replay"
    assert plans.resolve_mode("auto", 10**6, False, 8, H200, t) == "flush"  # a state dtype not measured faster
    assert plans.resolve_mode("auto", 10**6, True, 8, Device(132, 8), t) == "flush"  # no persistent kernels
    monkeypatch.setenv(plans.ADAPTIVE_THRESHOLD_ENV, "1000")
    assert plans.resolve_mode("auto", 999, True, 8, H200, t) == "flush"
    assert plans.resolve_mode("auto", 1000, True, 8, H200, t) == "replay"
    assert plans.resolve_mode("auto", 999, True, 8, H200, Tuning(adaptive_threshold=5)) == "replay"  # tuning first
    with pytest.raises(ValueError, match="mode"):
        plans.resolve_mode("fast", 1, True, 8, H200, t)


def test_auto_runs_the_fused_band_a_crossover_gives(monkeypatch):
    monkeypatch.delenv(plans.ADAPTIVE_THRESHOLD_ENV, raising=False)
    t = Tuning()
    assert plans.resolve_mode("auto", 131, True, 8, H200, t, fused_per_sm=1.0) == "flush"
    assert plans.resolve_mode("auto", 132, True, 8, H200, t, fused_per_sm=1.0) == "fused"
    assert plans.resolve_mode("auto", 8 * 132, True, 8, H200, t, fused_per_sm=1.0) == "replay"
    assert plans.resolve_mode("auto", 1, True, 8, H200, t, fused_per_sm=0.0) == "fused"
    assert plans.resolve_mode("auto", 500, False, 8, H200, t, fused_per_sm=0.0) == "flush"  # replay not faster
    assert plans.resolve_mode("auto", 500, True, 8, plans.CPU, t, fused_per_sm=0.0) == "replay"  # the reference
    flush, fused = plans.LaunchPlan("flush", (), 8, (1, 1, 1)), plans.LaunchPlan("fused", (), 8, (1, 1, 1))

    def pick(work, per_sm):
        crossover = Crossover("gdn", "*", "*", 8, fused_min_work_per_sm=per_sm)
        return plans.non_replay_plan("op", "auto", (), work, True, crossover, H200, t, lambda: flush, lambda: fused)

    assert pick(200, 1.0) is fused and pick(100, 1.0) is flush and pick(200, None) is flush
    assert pick(8 * 132, 1.0) is None  # the replay kernels


# The decode state kernels' row tiles on the H200 (fp32 state, bf16 activations), batch -> (baseline and flush,
# fused). The row-tile sweep (benchmarks/results/dev/decode-row-tiles-h200.json) timed each of them within 6% of the
# fastest tile of its kernel for Qwen3.5-4B, Kimi-Linear and Super; Nano's 40- and 80-row tiles were not swept.
DECODE_TILES = {
    "qwen3.5-4b": {1: (16, 16), 4: (64, 64), 8: (64, 64), 64: (64, 64)},
    "kimi-linear-48b": {1: (16, 16), 8: (64, 64)},
    "nemotron-3-super-120b": {1: (32, 32), 4: (64, 64), 8: (64, 64)},
    "nemotron-3-nano-4b": {1: (40, 40), 8: (80, 40)},
}


@pytest.mark.parametrize("model", sorted(DECODE_TILES))
def test_decode_state_tiles(model):
    """Baseline, flush and one-launch replay take the largest row tile whose grid gives every SM a CTA (the fused
    kernel none above FUSED_MAX_ROWS_PER_CTA rows), which fits small batches in one wave of CTAs."""
    dims = get_preset(model).ssm_dims
    fam = family_of(dims)
    layer = _layer(dims, torch.float32, torch.bfloat16, 16)
    state = torch.empty(2, dims.heads, dims.rows, dims.cols)
    for batch, (state_tile, fused_tile) in DECODE_TILES[model].items():
        baseline = fam.state_update_plan(state, batch, torch.bfloat16, device=H200)
        flush = fam.replay_plan(layer, batch, "flush", device=H200)
        fused = fam.replay_plan(layer, batch, "fused", device=H200)
        assert (baseline.rows_per_cta, flush.rows_per_cta, fused.rows_per_cta) == (state_tile, state_tile, fused_tile)
        assert fused.grid == (dims.rows // fused_tile, dims.heads, batch)
        assert (dims.rows // state_tile) * dims.heads * batch >= H200.sm_count or state_tile == min(
            t for t in (4, 8, 16, 20, 32, 40, 64) if dims.rows % t == 0)


@pytest.mark.parametrize("model", ["nemotron-3-super-120b", "qwen3.5-4b", "kimi-linear-48b"])
@pytest.mark.parametrize("L", [1, 16, 32])
def test_fused_plans_run_the_state_grid_with_the_ring_buffer(model, L):
    """mode='fused' on a GPU: the state kernels' grid (flush and fused heads and batch alike), GDN/KDA with their
    ring buffer's bytes (Mamba-2 stages its ring in static shared memory); on a CPU the reference replay step (which
    the one-launch replay equals)."""
    dims = get_preset(model).ssm_dims
    fam = family_of(dims)
    layer = _layer(dims, torch.float32, torch.bfloat16, L)
    for batch in (1, 8, 64):
        fused = fam.replay_plan(layer, batch, "fused", device=H200)
        flush = fam.replay_plan(layer, batch, "flush", device=H200)
        assert fused.mode == "fused" and fused.rows_per_cta <= plans.FUSED_MAX_ROWS_PER_CTA
        assert fused.grid == (dims.rows // fused.rows_per_cta, dims.heads, batch)
        assert flush.grid[1:] == fused.grid[1:]
        tuned = fam.replay_plan(layer, batch, "fused", Tuning(rows_per_cta=8), device=H200)
        assert (tuned.rows_per_cta, tuned.grid) == (8, (dims.rows // 8, dims.heads, batch))
        if fam.name == "mamba2":
            assert fused.fold_bytes == 0
        else:
            kda = fam.name == "kda"
            assert fused.fold_bytes == delta_fused_bytes(L, fused.rows_per_cta, dims.cols,
                                                         key_ring_dtype(torch.bfloat16, kda).itemsize, 2, kda)
            assert fused.fold_bytes >= delta_fold_bytes(L, dims.cols, 2, kda) + L * fused.rows_per_cta * 2
        assert plans.Launch.from_words(fused.words).mode == "fused"
    assert fam.replay_plan(layer, 8, "fused", device=plans.CPU).mode == "replay"
    assert plans.resolve_mode("fused", 10**6, True, 8, H200, Tuning()) == "fused"


@pytest.mark.parametrize("model,heads_per_cta", [("nemotron-3-super-120b", 4), ("nemotron-3-nano-4b", 2),
                                                  ("nemotron-3-nano-4b", 12)])
def test_fused_stream_plans(model, heads_per_cta):
    """Tuning(fused_heads_per_cta=k): the streaming one-launch replay's grid (k consecutive heads of a group per CTA),
    its stages of one head's checkpoint and the records' bytes; its words round-trip; whole-head modules of plain
    checkpoints hold its kernel; shapes and checkpoints it cannot take are refused by name."""
    dims = get_preset(model).ssm_dims
    H, P, N, L = dims.nheads, dims.head_dim, dims.d_state, 16
    layer = _layer(dims, torch.float32, torch.bfloat16, L)
    for stages, want in ((None, min(plans.FUSED_STREAM_STAGES, heads_per_cta)), (3, min(3, heads_per_cta))):
        plan = mamba2.replay_plan(layer, 8, "fused", Tuning(fused_heads_per_cta=heads_per_cta, stages=stages),
                                  device=H200)
        assert plan.mode == "fused" and plan.grid == (H // heads_per_cta, 1, 8) and plan.rows_per_cta == P
        assert (plan.stages, plan.stage_bytes) == (want, P * N * 4)
        assert plan.fold_bytes == mamba2_stream_records_bytes(L, heads_per_cta, P, 2)
        launch = plans.Launch.from_words(plan.words)  # what run_plan launches with
        assert launch.stages == want
        assert launch.shared_bytes == want * P * N * 4 + plan.fold_bytes <= mamba2.MAX_STREAM_SHARED_BYTES
        assert plan.programmatic and plan.l2_hints == (plan.grid[0] * 8 <= plans.L2_HINT_MAX_CTAS_PER_SM * 132)
    assert "mamba2_fused_stream_kernel" in mamba2.kernel_config(P, N, torch.float32, torch.bfloat16, P).kernels
    assert "mamba2_fused_stream_kernel" not in mamba2.kernel_config(P, N, torch.float32, torch.bfloat16, 16).kernels
    assert "mamba2_fused_stream_kernel" not in mamba2.kernel_config(P, N, parse_state_label("fp8"), torch.bfloat16,
                                                                     P).kernels
    per_group = H // dims.n_groups
    with pytest.raises(ValueError, match=f"^fused_heads_per_cta: expected a divisor of the {per_group} heads per "
                                         f"group, got 5$"):
        mamba2.replay_plan(layer, 8, "fused", Tuning(fused_heads_per_cta=5), device=H200)
    with pytest.raises(ValueError, match="^fused_heads_per_cta: the streaming one-launch replay needs sm_90"):
        mamba2.replay_plan(layer, 8, "fused", Tuning(fused_heads_per_cta=heads_per_cta), device=Device(108, 8))
    stored = _layer(dims, parse_state_label("fp8"), torch.bfloat16, L)
    with pytest.raises(ValueError, match="^fused_heads_per_cta: the streaming one-launch replay takes plain "
                                         "checkpoints, got fp8"):
        mamba2.replay_plan(stored, 8, "fused", Tuning(fused_heads_per_cta=heads_per_cta), device=H200)
    for bad in (0, plans.FUSED_STREAM_MAX_HEADS + 1):
        with pytest.raises(ValueError, match=f"^fused_heads_per_cta: expected None or 1..16, got {bad}$"):
            Tuning(fused_heads_per_cta=bad)


@pytest.mark.parametrize("model,state", [("nemotron-3-super-120b", "fp32"), ("nemotron-3-nano-4b", "bf16"),
                                         ("qwen3.5-4b", "fp32"), ("kimi-linear-48b", "fp32"),
                                         ("nemotron-3-super-120b", "nvfp4"), ("qwen3.5-4b", "nvfp4/dual/fp16")])
def test_every_plan_launches_kernels_of_its_modules(model, state):
    """Every launch run_plan makes for a plan of any mode names a kernel of the module the op builds from the plan's
    row tile (flush rows: of ``flush_rows_per_cta``), with dynamic shared memory the plan accounts for."""
    dims = get_preset(model).ssm_dims
    spec = parse_state_label(state)
    layer = _layer(dims, spec, torch.bfloat16, 16)
    mamba = family_of(dims).name == "mamba2"
    tunings = [Tuning()] + ([Tuning(fused_heads_per_cta=4)] if mamba and state == "fp32" else [])
    seen = set()
    for mode in ("auto", "flush", "fused", "replay"):
        for tuning in tunings if mode == "fused" else [Tuning()]:
            for batch in (1, 8, 64, 256):
                plan = (mamba2.replay_plan if mamba else delta.replay_plan)(
                    layer, batch, *(() if mamba else (dims.per_channel_gate,)), mode, tuning, device=H200)
                words = plans.Launch.from_words(plan.words)
                for step in launch.plan_launches(words):
                    tile = words.flush_rows_per_cta if step.kernel == "flush_rows" and words.flush_rows_per_cta \
                        else words.rows_per_cta
                    if mamba:
                        config = mamba2.kernel_config(dims.head_dim, dims.d_state, spec, torch.bfloat16, tile)
                        name = mamba2.KERNELS[step.kernel]
                    else:
                        config = delta.kernel_config(dims.per_channel_gate, dims.cols, dims.rows, spec,
                                                     torch.bfloat16, tile)
                        name = delta.KERNELS[step.kernel]
                    assert name in config.kernels, (mode, tuning, batch, step)
                    assert step.shared <= plans.SHARED_BYTES_PER_SM - plans.STATIC_SHARED_BYTES, (mode, batch, step)
                    seen.add(step.kernel)
    assert {"fused", "main", "prep"} <= seen and ("fused_stream" in seen) == (len(tunings) == 2)
    assert ("flush_rows" in seen) == (spec.mode != "plain"), seen  # stored checkpoints keep flush rows apart


def test_fused_stream_plans_refuse_heads_that_do_not_fit_or_are_not_contiguous():
    """A head of 128 x 256 fp32 (128 KiB) fits one stage, not two; a pool whose head rows are strided is refused."""
    dims = Mamba2Dims(nheads=8, head_dim=128, d_state=256, n_groups=1)
    layer = _layer(dims, torch.float32, torch.bfloat16, 16)
    assert mamba2.replay_plan(layer, 8, "fused", Tuning(fused_heads_per_cta=1), device=H200).stages == 1
    with pytest.raises(ValueError, match="^fused_heads_per_cta: 2 stages of 131072 bytes and the records of 2 heads"):
        mamba2.replay_plan(layer, 8, "fused", Tuning(fused_heads_per_cta=2), device=H200)
    small = _layer(Mamba2Dims(nheads=4, head_dim=64, d_state=128, n_groups=1), torch.float32, torch.bfloat16, 16)
    small.state = torch.zeros(2, 4, 64, 256)[..., :128]  # rows of 128 columns 256 apart
    with pytest.raises(ValueError, match=r"^state: the streaming one-launch replay copies whole heads"):
        mamba2.replay_plan(small, 8, "fused", Tuning(fused_heads_per_cta=2), device=H200)


def test_replay_on_a_pre_hopper_gpu_is_refused():
    layer = _layer(get_preset("tiny-nemotron").ssm_dims, torch.float32, torch.bfloat16, 16)
    assert mamba2.replay_plan(layer, 512, "auto", device=Device(108, 8)).mode == "flush"
    with pytest.raises(RuntimeError, match="sm_90"):
        mamba2.replay_plan(layer, 512, "replay", device=Device(108, 8))


def test_fold_buffer_only_where_it_costs_no_stage():
    """The fold buffer is kept only if the CTA keeps its stages, or, fold_first (KDA), while 3 stages remain."""
    kda_key = key_ring_dtype(torch.bfloat16, True).itemsize
    fold = delta_fold_bytes(16, 128, kda_key, True)
    assert fold == 16 * 128 * 2  # KDA: pre-decayed keys only, no gates
    assert delta_fold_bytes(16, 128, key_ring_dtype(torch.float16, True).itemsize, True) == 16 * 128 * 4
    assert delta_fold_bytes(16, 128, 2, False) == 16 * 128 * 2 + 16 * 4
    small, large = delta_stage_bytes(16, 32, 128, 512, 2, True), delta_stage_bytes(16, 64, 128, 512, 2, True)
    t = Tuning()

    def plan(stage, fold_bytes, fold_first, tuning=t):
        p = plans.persistent_plan(stage, 10_000, fold_bytes, fold_first, None, H200, tuning)
        return p.grid, p.stages, p.fold_bytes

    assert plan(small, fold, False) == (3 * 132, 4, 0)  # the buffer would cost a stage
    assert plan(small, fold, True) == (3 * 132, 3, fold)
    assert plan(large, fold, True) == (3 * 132, 2, 0)  # 1 stage left
    gdn_fold = delta_fold_bytes(16, 128, 2, False)
    assert plan(delta_stage_bytes(16, 64, 128, 512, 2, False), gdn_fold, False) == (3 * 132, 2, gdn_fold)
    assert plan(small, fold, True, Tuning(fold_buffer=False)) == (3 * 132, 4, 0)


def test_tail_start_claims_whole_waves_after_the_first():
    """None: nothing claimed; else the round-robin share rounded down to whole waves, at least one wave."""
    assert plans.tail_start(1000, 100, None) == 1000
    assert plans.tail_start(1000, 100, 0.1) == 900
    assert plans.tail_start(1050, 100, 0.1) == 900  # 945 round-robin tiles -> 9 whole waves
    assert plans.tail_start(1000, 100, 0.0) == 1000
    assert plans.tail_start(1050, 100, 0.0) == 1000  # the last partial wave is claimed
    assert plans.tail_start(1000, 100, 1.0) == 100  # the first wave stays round-robin
    assert plans.tail_start(80, 100, 0.5) == 80  # one partial wave: nothing to claim


def test_delta_rule_tail_claims_only_for_4_byte_states():
    dims = get_preset("kimi-linear-48b").ssm_dims
    for sd, claims in ((torch.float32, True), (torch.bfloat16, False), (torch.float16, False)):
        p = FAMILIES["kda"].replay_plan(_layer(dims, sd, torch.bfloat16, 16), 256, "replay", device=H200)
        assert (p.tail_fraction is not None) == claims and (p.tail_start < p.num_tiles) == claims


def test_step_scratch_keeps_the_claim_counter_before_the_rows():
    """The kernels address the claim counter as step[-1] of the rows they are given."""
    step = ReplayStateCache.gdn(1, 5, 2, 4, 64, 64, buffer_len=4, device="cpu").layer(0).step
    assert step.shape == (6,)
    assert launch.step_rows(step) == step.data_ptr() + step.element_size()
    assert launch.step_rows(None) == 0


@pytest.mark.parametrize("env,tuned,expected", [(None, None, True), ("0", None, False), ("1", None, True),
                                                ("1", False, False), ("0", True, True)])
def test_programmatic_prep_default_env_and_tuning(env, tuned, expected, monkeypatch):
    if env is None:
        monkeypatch.delenv(plans.PREP_PDL_ENV, raising=False)
    else:
        monkeypatch.setenv(plans.PREP_PDL_ENV, env)
    layer = _layer(get_preset("tiny-nemotron").ssm_dims, torch.float32, torch.bfloat16, 16)
    plan = mamba2.replay_plan(layer, 512, "replay", Tuning(programmatic_prep=tuned), device=H200)
    assert plan.programmatic_prep is expected


def test_prep_env_rejects_other_values(monkeypatch):
    monkeypatch.setenv(plans.PREP_PDL_ENV, "yes")
    with pytest.raises(ValueError, match=plans.PREP_PDL_ENV):
        plans.programmatic_prep(Tuning())


def test_plan_words_round_trip():
    layer = _layer(get_preset("qwen3.5-122b").ssm_dims, torch.float32, torch.bfloat16, 16)
    plan = FAMILIES["gdn"].replay_plan(layer, 256, "replay", device=H200)
    back = plans.Launch.from_words(plan.words)
    assert (back.mode, back.rows_per_cta, back.grid, back.stages, back.stage_bytes, back.fold_bytes,
            back.tail_start, back.prep_grid, back.prep_threads, back.programmatic_prep, back.flush_ctas) == (
        plan.mode, plan.rows_per_cta, plan.grid, plan.stages, plan.stage_bytes, plan.fold_bytes, plan.tail_start,
        plan.prep_grid, plan.prep_threads, plan.programmatic_prep, plan.flush_ctas)
    assert plan.record()["mode"] == "replay" and "key" not in plan.record()
    apart = mamba2.replay_plan(_layer(get_preset("nemotron-3-super-120b").ssm_dims, state_spec("nvfp4"),
                                      torch.bfloat16, 16, slots=257), 256, "replay", device=H200)
    assert apart.flush_ctas and plans.Launch.from_words(apart.words).flush_ctas == apart.flush_ctas
    assert apart.flush_bytes == 0  # the Mamba-2 flush-rows kernel stages in static shared memory
    # the GDN/KDA flush-rows kernel stages an item's ring: the one-launch replay's buffer for the plan's row tile
    for fam_name, model in (("gdn", "qwen3.5-4b"), ("kda", "kimi-linear-48b")):
        dims = get_preset(model).ssm_dims
        layer = _layer(dims, state_spec("nvfp4"), torch.bfloat16, 16, slots=257)
        stored = FAMILIES[fam_name].replay_plan(layer, 256, "replay", device=H200)
        K = layer.checkpoint().shape[3]
        want = delta_fused_bytes(16, stored.rows_per_cta, K, layer.k_ring.element_size(), 2, fam_name == "kda")
        assert stored.flush_ctas and stored.flush_bytes == want > 0, fam_name
        assert plans.Launch.from_words(stored.words).flush_bytes == want
    assert plan.flush_ctas == 0 and plan.flush_bytes == 0  # fp32: flush rows fold in the main kernel


@pytest.mark.parametrize("label", ["nvfp4", "fp8/dual/fp32", "nvfp4/dual/fp16+sr", "bf16+sr", "fp32", "bf16"])
def test_mamba2_stored_checkpoints_keep_flush_rows_apart(label):
    """Stored checkpoints: the persistent kernel leaves flush rows to the flush-rows kernel (the tuning's CTAs per
    SM, at most one per (row, head)), keeps no fold buffer and claims only the plain states' tail, and a tuning
    cannot keep them in the main kernel (it never folds there); plain checkpoints fold flush rows in the persistent
    kernel unless a tuning leaves them apart."""
    dims = get_preset("nemotron-3-super-120b").ssm_dims
    spec = parse_state_label(label)
    layer = _layer(dims, spec, torch.bfloat16, 16, slots=257)
    plan = mamba2.replay_plan(layer, 256, "replay", device=H200)
    if spec.stored:
        assert plan.flush_ctas == Tuning().flush_ctas_per_sm * H200.sm_count
        assert plan.fold_bytes == 0 and plan.tail_fraction == mamba2.TAIL_FRACTION
        assert mamba2.replay_plan(layer, 1, "replay", device=H200).flush_ctas == dims.nheads  # one CTA per head
    else:
        assert plan.flush_ctas == 0 and plan.fold_bytes > 0
    if spec.stored:  # its main kernel never folds
        with pytest.raises(ValueError, match="flush_apart"):
            mamba2.replay_plan(layer, 256, "replay", Tuning(flush_apart=False), device=H200)
    else:
        assert mamba2.replay_plan(layer, 256, "replay", Tuning(flush_apart=True), device=H200).flush_ctas > 0


@pytest.mark.parametrize("model", ["qwen3.5-4b", "kimi-linear-48b"])
def test_delta_stored_checkpoints_keep_flush_rows_apart(model):
    """GDN/KDA as Mamba-2: stored checkpoints leave flush rows to the flush-rows kernel (a CTA per row tile at most),
    whatever their tile; plain ones fold them in the persistent kernel; 16-bit plain states, whose main kernel hands
    tiles out round-robin only, refuse flush rows apart."""
    dims = get_preset(model).ssm_dims
    fam = family_of(dims)
    stored = fam.replay_plan(_layer(dims, state_spec("nvfp4"), torch.bfloat16, 16, slots=257), 256, "replay",
                             device=H200)
    assert stored.flush_ctas == Tuning().flush_ctas_per_sm * H200.sm_count and stored.fold_bytes == 0
    assert stored.tail_fraction == delta.TAIL_FRACTION
    small = fam.replay_plan(_layer(dims, state_spec("nvfp4"), torch.bfloat16, 16), 1, "replay", device=H200)
    assert small.flush_ctas == small.num_tiles
    plain = fam.replay_plan(_layer(dims, torch.float32, torch.bfloat16, 16, slots=257), 256, "replay", device=H200)
    assert plain.flush_ctas == 0
    fp8 = fam.replay_plan(_layer(dims, state_spec("fp8"), torch.bfloat16, 16, slots=257), 256, "replay", device=H200)
    assert fp8.flush_ctas > 0 and fp8.rows_per_cta == delta.WHOLE_HEAD_ROWS  # whole heads: apart measured faster
    fp8_64 = fam.replay_plan(_layer(dims, state_spec("fp8"), torch.bfloat16, 16, slots=257), 256, "replay",
                             Tuning(rows_per_cta=64), device=H200)
    assert fp8_64.flush_ctas > 0
    with pytest.raises(ValueError, match="flush_apart"):
        fam.replay_plan(_layer(dims, state_spec("fp8"), torch.bfloat16, 16, slots=257), 256, "replay",
                        Tuning(flush_apart=False), device=H200)
    if fam.name == "gdn":  # 256 key channels: no whole-head tiles, flush rows apart all the same
        wide_keys = fam.replay_plan(_layer(replace(dims, head_k_dim=256), state_spec("fp8"), torch.bfloat16, 16,
                                           slots=257), 256, "replay", device=H200)
        assert wide_keys.flush_ctas > 0 and wide_keys.tail_fraction == delta.TAIL_FRACTION
    with pytest.raises(ValueError, match="flush_apart"):
        fam.replay_plan(_layer(dims, torch.bfloat16, torch.bfloat16, 16, slots=257), 256, "replay",
                        Tuning(flush_apart=True), device=H200)


@pytest.mark.parametrize("model", ["qwen3.5-4b", "kimi-linear-48b"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_delta_verify_plan_takes_the_persistent_kernel_from_its_work_per_sm(model, state_dtype):
    """Below VERIFY_PERSISTENT_MIN_WORK_PER_SM (row, value head) work items per SM the grid kernel without a prep on
    32-row tiles at every batch (a tuning's tile kept), from there the prep and the persistent kernel: its stages fit
    twice per CTA at 2 CTAs per SM, no fold buffer, a prep CTA per (key head, row) for GDN and per (value head, row)
    for KDA; plans made for another call are refused."""
    dims, T, L = get_preset(model).ssm_dims, 4, 19
    layer = _layer(dims, state_dtype, torch.bfloat16, L, slots=64)
    HV, V, K = layer.state.shape[1:]
    first = -(-delta.VERIFY_PERSISTENT_MIN_WORK_PER_SM * H200.sm_count // HV)  # the first persistent batch
    grid = delta.verify_plan(layer, first - 1, T, device=H200)
    assert grid.mode == "grid" and grid.prep_threads == 0 and grid.grid == (V // 32, HV, first - 1)
    assert delta.verify_plan(layer, 1, T, device=H200).rows_per_cta == delta.VERIFY_GRID_ROWS_PER_CTA == 32
    pinned = replace(delta.VERIFY_TUNING, rows_per_cta=8)
    assert delta.verify_plan(layer, 1, T, pinned, device=H200).grid == (V // 8, HV, 1)
    plan = delta.verify_plan(layer, first, T, device=H200)
    tile = plan.rows_per_cta
    assert plan.mode == "replay" and plan.fold_bytes == 0 and plan.stages == 2
    assert plan.stage_bytes == delta_verify_stage_bytes(L, T, tile, K, layer.state.element_size(), 2,
                                                        layer.k_ring.element_size(), model.startswith("kimi"))
    assert plan.num_tiles == first * HV * V // tile and plan.grid == (min(plan.num_tiles, 2 * H200.sm_count), 1, 1)
    assert plan.prep_grid == (layer.k_ring.shape[1], first, 1) and plan.programmatic_prep
    assert layer.k_ring.shape[1] == (HV if model.startswith("kimi") else dims.num_k_heads)
    assert plans.stages_for(plan.stage_bytes, 2, 0) >= 2
    forced = delta.verify_plan(layer, 1, T, replace(delta.VERIFY_TUNING, adaptive_threshold=0), device=H200)
    assert forced.mode == "replay"
    v = torch.zeros(first, T, HV, V, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="plan: made for"):
        delta.resolved_verify_plan(layer, v[:first - 1], delta.VERIFY_TUNING, plan)


def test_gdn_verify_plan_takes_the_grid_kernel_above_the_prep_group():
    """A GDN verify prep CTA shares a key head's dots among at most GDN_PREP_MAX_GROUP value heads: more per key
    head run the grid kernel at every batch."""
    dims = replace(get_preset("qwen3.5-4b").ssm_dims, num_k_heads=1, num_v_heads=GDN_PREP_MAX_GROUP)
    plan = delta.verify_plan(_layer(dims, torch.float32, torch.bfloat16, 19, slots=512), 512, 4, device=H200)
    assert plan.mode == "replay" and plan.prep_grid == (1, 512, 1)
    dims = replace(dims, num_v_heads=2 * GDN_PREP_MAX_GROUP)
    plan = delta.verify_plan(_layer(dims, torch.float32, torch.bfloat16, 19, slots=512), 512, 4, device=H200)
    assert plan.mode == "grid"


def test_mamba2_verify_runs_in_one_launch_up_to_its_work_per_sm_only():
    """Tuning.one_launch_verify_max_work_per_sm: up to that many work items per SM the one-launch kernel (a
    programmatic state kernel without the prep kernel) on the largest tile up to ONE_LAUNCH_VERIFY_MAX_ROWS with
    ONE_LAUNCH_VERIFY_MIN_CTAS_PER_SM CTAs per SM, above it prep + grid on the grid kernel's tile; from the persistent
    verify's threshold on the persistent plan, unchanged."""
    dims = get_preset("nemotron-3-super-120b").ssm_dims  # 128 heads: 0.97 work items per SM per row
    layer = _layer(dims, torch.float32, torch.bfloat16, 19, slots=256)
    never = replace(mamba2_spec.VERIFY_TUNING, one_launch_verify_max_work_per_sm=0)
    always = replace(mamba2_spec.VERIFY_TUNING, one_launch_verify_max_work_per_sm=float("inf"))
    assert (mamba2_spec.ONE_LAUNCH_VERIFY_MAX_ROWS, mamba2_spec.ONE_LAUNCH_VERIFY_MIN_CTAS_PER_SM) == (32, 3)
    for batch, tile in ((1, 16), (2, 32), (4, 32), (8, 32)):  # 64 rows per head: 512 CTAs at batch 1 from 16 rows
        grid = mamba2_spec.verify_plan(layer, batch, 4, never, device=H200)
        single = mamba2_spec.verify_plan(layer, batch, 4, always, device=H200)
        assert grid.mode == single.mode == "grid" and grid.prep_threads > 0 and single.prep_threads == 0
        assert single.rows_per_cta == tile and single.grid == (64 // tile, 128, batch) and single.prep_grid == (0, 0, 0)
        assert grid.rows_per_cta <= 16  # the grid kernel's own heuristic
        pinned = replace(always, rows_per_cta=8)
        assert mamba2_spec.verify_plan(layer, batch, 4, pinned, device=H200).grid == (8, 128, batch)
        ctas = single.grid[0] * single.grid[1] * single.grid[2]
        assert single.programmatic and single.l2_hints == (ctas <= plans.L2_HINT_MAX_CTAS_PER_SM * H200.sm_count)
        assert not grid.programmatic  # after prep, the grid kernel launches plainly
        default = mamba2_spec.verify_plan(layer, batch, 4, device=H200)
        one_launch = batch * dims.nheads <= plans.ONE_LAUNCH_VERIFY_MAX_WORK_PER_SM * H200.sm_count
        assert default == (single if one_launch else grid), batch
    assert mamba2_spec.verify_plan(layer, 4, 4, device=H200).prep_threads == 0  # batch 4 runs in one launch
    assert mamba2_spec.verify_plan(layer, 8, 4, device=H200).prep_threads > 0
    assert mamba2_spec.verify_plan(layer, 256, 4, always, device=H200) == mamba2_spec.verify_plan(layer, 256, 4,
                                                                                                   device=H200)
    with pytest.raises(ValueError, match="one_launch_verify_max_work_per_sm"):
        Tuning(one_launch_verify_max_work_per_sm=-1)


def test_delta_verify_plan_runs_one_cta_per_sm_above_128_key_channels():
    dims = replace(get_preset("qwen3.5-4b").ssm_dims, head_k_dim=256)
    layer = _layer(dims, torch.float32, torch.bfloat16, 19, slots=64)
    plan = delta.verify_plan(layer, 64, 4, device=H200)
    assert plan.mode == "replay" and plan.grid[0] == min(plan.num_tiles, H200.sm_count)
    assert delta.verify_ctas_per_sm(256) == 1 and delta.verify_ctas_per_sm(128) == 2


@pytest.mark.parametrize("model", ["nemotron-3-super-120b", "nemotron-3-nano-4b", "qwen3.5-4b", "kimi-linear-48b"])
def test_replay_main_kernel_ctas_per_sm_follow_its_launch_bounds(model):
    """The replay main kernel's CTAs per SM on sm_90: on a stored checkpoint, whatever its rounding, the family's
    default (Mamba-2 STORED_DEFAULT_CTAS, STORED_TWO_HEAD_CTAS with two-head tiles; GDN/KDA 4) at most its launch
    bounds (Mamba-2 STORED_REPLAY_CTAS, GDN/KDA 4: it never folds); on a plain one 3; a tuning asking for fewer keeps
    its own, one asking for more gets the bounds."""
    from trtllm_replayssm.core.formats import parse_state_label

    dims = get_preset(model).ssm_dims
    fam = family_of(dims)
    for label in ("nvfp4/dual/fp16+sr", "fp8/dual/fp32+sr", "nvfp4/dual/fp16", "fp8+sr", "nvfp4", "fp32"):
        spec = parse_state_label(label)
        layer = _layer(dims, spec, torch.bfloat16, 16, slots=513)
        stored = (4, 4)
        if fam.name == "mamba2":
            two_heads = fam.replay_plan(layer, 512, "replay", device=H200).rows_per_cta > dims.head_dim
            assert two_heads is (model == "nemotron-3-super-120b" and spec.stored), label
            stored = (mamba2.STORED_TWO_HEAD_CTAS if two_heads else mamba2.STORED_DEFAULT_CTAS,
                      mamba2.STORED_REPLAY_CTAS)
        default, bound = stored if spec.stored else (plans.PLAIN_REPLAY_CTAS, plans.PLAIN_REPLAY_CTAS)
        knob = "stored_ctas_per_sm" if spec.stored else "ctas_per_sm"
        for tuning, ctas in ((plans.Tuning(), default), (plans.Tuning(**{knob: 1}), 1),
                             (plans.Tuning(**{knob: 9}), bound)):
            plan = fam.replay_plan(layer, 512, "replay", tuning, device=H200)
            assert plan.grid[0] == ctas * H200.sm_count, (label, tuning)


@pytest.mark.parametrize("model", ["qwen3.5-4b", "kimi-linear-48b"])
def test_delta_flush_rows_kernel_from_another_row_tile(model):
    """Tuning.flush_rows_per_cta runs the flush-rows kernel of another shipped module than the main kernel's: its items,
    CTAs and staged ring follow that tile, the words carry it, and a tile the layer does not ship is refused."""
    dims = get_preset(model).ssm_dims
    fam = family_of(dims)
    layer = _layer(dims, state_spec("nvfp4"), torch.bfloat16, 16, slots=257)
    V, K = layer.checkpoint().shape[2:]
    kda = fam.name == "kda"
    whole = fam.replay_plan(layer, 256, "replay", device=H200)
    assert whole.rows_per_cta == V and whole.flush_rows_per_cta == 0
    split = fam.replay_plan(layer, 256, "replay", Tuning(flush_rows_per_cta=32), device=H200)
    assert (split.rows_per_cta, split.grid, split.stages) == (whole.rows_per_cta, whole.grid, whole.stages)
    assert split.flush_rows_per_cta == 32
    assert split.flush_bytes == delta_fused_bytes(16, 32, K, layer.k_ring.element_size(), 2, kda) < whole.flush_bytes
    HV = layer.checkpoint().shape[1]
    small = fam.replay_plan(layer, 2, "replay", Tuning(rows_per_cta=V, flush_rows_per_cta=32), device=H200)
    assert (small.rows_per_cta, small.flush_ctas) == (V, 2 * HV * V // 32)  # one CTA per 32-row item at most
    assert plans.Launch.from_words(split.words).flush_rows_per_cta == 32
    same = fam.replay_plan(layer, 256, "replay", Tuning(flush_rows_per_cta=V), device=H200)
    assert same.flush_rows_per_cta == 0 and same.flush_bytes == whole.flush_bytes
    with pytest.raises(ValueError, match=r"^flush_rows_per_cta: expected one of the layer's row tiles"):
        fam.replay_plan(layer, 256, "replay", Tuning(flush_rows_per_cta=48), device=H200)
    with pytest.raises(ValueError, match=r"^flush_rows_per_cta: expected None or >= 1"):
        Tuning(flush_rows_per_cta=0)


@pytest.mark.parametrize("model", ["qwen3.5-4b", "kimi-linear-48b"])
def test_delta_stored_replay_streams_whole_heads(model):
    """On sm_90 a stored checkpoint's replay takes tiles of a whole 128-row head where the heuristic takes its largest
    tile, on 4 CTAs per SM, but an NVFP4 read copy beside a master with stochastic rounding or (KDA) beside an fp32
    one; smaller batches keep the heuristic's tile, and every whole-head module is among the layer's kernel
    configs."""
    from trtllm_replayssm.core.formats import parse_state_label

    dims = get_preset(model).ssm_dims
    fam = family_of(dims)
    kda = fam.name == "kda"
    for label, whole in (("fp8", True), ("nvfp4", True), ("fp8/dual/fp32", True), ("fp8+sr", True),
                         ("nvfp4/dual/fp16", True), ("nvfp4/dual/bf16", True), ("nvfp4/dual/fp8", True),
                         ("nvfp4/dual/fp8+sr", False),
                         ("nvfp4/dual/fp32", not kda), ("nvfp4/dual/fp16+sr", False), ("nvfp4/dual/fp32+sr", False),
                         ("fp32", False)):
        spec = parse_state_label(label)
        layer = _layer(dims, spec, torch.bfloat16, 16, slots=257)
        V, K = layer.checkpoint().shape[2:]
        plan = fam.replay_plan(layer, 256, "replay", device=H200)
        assert (plan.rows_per_cta == delta.WHOLE_HEAD_ROWS) == whole, label
        if whole:
            assert plan.grid[0] == 4 * H200.sm_count and plan.flush_ctas > 0, label
        shipped = delta.kernel_configs(kda, K, V, spec, torch.bfloat16)
        wide = [c for c in shipped if c.family == fam.name and c.param("vtile") == delta.WHOLE_HEAD_ROWS]
        assert bool(wide) == whole, label
    small = fam.replay_plan(_layer(dims, parse_state_label("fp8"), torch.bfloat16, 16, slots=9), 8, "replay",
                            device=H200)
    assert small.rows_per_cta < delta.WHOLE_HEAD_ROWS
    nvfp4 = parse_state_label("nvfp4")
    assert delta.whole_head_tuning(nvfp4, 128, H200, plans.Tuning(ctas_per_sm=1)).ctas_per_sm == 1
    # sm_100 and later (not measured there): 64-row tiles, flush rows apart, and a forced whole-head tile on one CTA
    # per SM (the kernel's launch bounds there)
    b200 = plans.Device(148, 10, 0)
    for label in ("fp8", "nvfp4", "fp8/dual/fp32"):
        plan = fam.replay_plan(_layer(dims, parse_state_label(label), torch.bfloat16, 16, slots=257), 256, "replay",
                               device=b200)
        assert plan.rows_per_cta < delta.WHOLE_HEAD_ROWS and plan.flush_ctas > 0, label
    forced = fam.replay_plan(_layer(dims, parse_state_label("nvfp4"), torch.bfloat16, 16, slots=257), 256, "replay",
                             plans.Tuning(rows_per_cta=delta.WHOLE_HEAD_ROWS), device=b200)
    assert forced.grid[0] == b200.sm_count
    for dev, ctas in ((H200, 4), (b200, 1)):  # stochastic rounding with a read copy: the whole-head bound still
        sr = fam.replay_plan(_layer(dims, parse_state_label("fp8/dual/fp32+sr"), torch.bfloat16, 16, slots=257), 256,
                             "replay", plans.Tuning(rows_per_cta=delta.WHOLE_HEAD_ROWS), device=dev)
        assert sr.grid[0] == ctas * dev.sm_count


@pytest.mark.parametrize("model", ["nemotron-3-nano-4b", "qwen3.5-4b", "kimi-linear-48b"])
def test_state_kernels_launch_as_programmatic_dependents_unless_tuned_off(model):
    dims = get_preset(model).ssm_dims
    family = family_of(dims).name
    fam = FAMILIES[family]
    layer = _layer(dims, torch.float32, torch.bfloat16, 16)
    state = torch.empty(2, dims.heads, dims.rows, dims.cols)
    for plan in (fam.replay_plan(layer, 8, "flush", device=H200), fam.replay_plan(layer, 8, "fused", device=H200),
                 fam.state_update_plan(state, 8, torch.bfloat16, device=H200)):
        assert plan.programmatic and plans.Launch.from_words(plan.words).programmatic
    plain = fam.replay_plan(layer, 8, "flush", Tuning(programmatic_state=False), device=H200)
    assert not plain.programmatic and not plans.Launch.from_words(plain.words).programmatic


@pytest.mark.parametrize("model", ["nemotron-3-super-120b", "qwen3.5-4b", "kimi-linear-48b"])
def test_state_kernels_hint_l2_on_small_grids_and_the_delta_one_launch_replay_on_every_grid(model):
    """LaunchPlan.l2_hints: up to L2_HINT_MAX_CTAS_PER_SM CTAs per SM; the GDN/KDA one-launch replay always; never
    for a plainly launched kernel; Tuning.l2_hints overrides; the word survives the op's plan words."""
    dims = get_preset(model).ssm_dims
    family = family_of(dims).name
    fam = FAMILIES[family]
    layer = _layer(dims, torch.float32, torch.bfloat16, 16)
    limit = plans.L2_HINT_MAX_CTAS_PER_SM * H200.sm_count
    seen = set()
    for batch in (1, 2, 4, 8, 16):
        for mode in ("flush", "fused"):
            plan = fam.replay_plan(layer, batch, mode, device=H200)
            ctas = plan.grid[0] * plan.grid[1] * plan.grid[2]
            expected = ctas <= limit or (mode == "fused" and family != "mamba2")
            assert plan.l2_hints is expected and plans.Launch.from_words(plan.words).l2_hints is expected
            seen.add(expected)
        state = torch.empty(batch, dims.heads, dims.rows, dims.cols)
        base = fam.state_update_plan(state, batch, torch.bfloat16, device=H200)
        assert base.l2_hints is (base.grid[0] * base.grid[1] * base.grid[2] <= limit)
    assert seen == {True, False}
    assert fam.replay_plan(layer, 16, "flush", Tuning(l2_hints=True), device=H200).l2_hints
    assert not fam.replay_plan(layer, 1, "flush", Tuning(l2_hints=False), device=H200).l2_hints
    assert not fam.replay_plan(layer, 1, "flush", Tuning(programmatic_state=False, l2_hints=True), device=H200).l2_hints


@pytest.mark.parametrize("model", ["nemotron-3-super-120b", "nemotron-3-nano-4b", "qwen3.5-4b", "qwen3.5-122b",
                                   "kimi-linear-48b", "glm-5.3-flash"])
@pytest.mark.parametrize("state_dtype", [torch.float32, torch.bfloat16])
def test_verify_plans_launch_shipped_modules(model, state_dtype):
    """Every verify plan at batch 1-64, 128, 256 and 512 (windows of 2, 4 and 8) runs a row tile whose module the
    catalog ships for the model (a tile outside it would compile at run time, unchecked by the kernel gate)."""
    from trtllm_replayssm.serving.catalog import spec_configs

    spec = get_preset(model)
    dims = spec.ssm_dims
    shipped = set(spec_configs(spec, state_dtype, torch.bfloat16))
    layer = _layer(dims, state_dtype, torch.bfloat16, 16 + 7, slots=512)
    _, H, V, K = layer.state.shape
    for T in (2, 4, 8):
        for batch in [*range(1, 65), 128, 256, 512]:
            if family_of(dims).name == "mamba2":
                tile = mamba2_spec.verify_plan(layer, batch, T, device=H200).rows_per_cta
                config = mamba2.kernel_config(V, K, state_dtype, torch.bfloat16, tile)
            else:
                tile = delta.verify_plan(layer, batch, T, device=H200).rows_per_cta
                config = delta.kernel_config(dims.per_channel_gate, K, V, state_dtype, torch.bfloat16, tile)
            assert config in shipped, (model, T, batch, tile)
