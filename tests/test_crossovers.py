"""CPU: the crossover table mode='auto' reads (core/crossovers.py): the shipped table parses, the most specific entry
wins, a family or arch without an entry gets the default, bad entries are refused, and the planners switch where the
table says."""
import json
import math
import sys
from pathlib import Path

import pytest

from trtllm_replayssm.core import crossovers
from trtllm_replayssm.core.crossovers import Crossover
from trtllm_replayssm.core.families import get_family
from trtllm_replayssm.core.plans import Device, Tuning
from trtllm_replayssm.serving.presets import get_preset

TABLE = (Crossover("mamba2", "*", "*", 3), Crossover("mamba2", "*", "sm_90", 8), Crossover("mamba2", "bf16", "sm_90", 20),
         Crossover("gdn", "fp32", "*", 5))


def test_the_shipped_table_parses_and_covers_every_family_on_hopper():
    table = crossovers.parse(json.loads(crossovers.TABLE.read_text()))
    assert {c.family for c in table if c.arch == "sm_90"} == set(crossovers.FAMILIES)
    assert all(c.source for c in table)


def test_the_most_specific_entry_wins():
    assert crossovers.entry("mamba2", "bf16", "sm_90", TABLE).min_work_per_sm == 20
    assert crossovers.entry("mamba2", "fp32", "sm_90", TABLE).min_work_per_sm == 8
    assert crossovers.entry("mamba2", "fp32", "sm_100", TABLE).min_work_per_sm == 3
    assert crossovers.entry("gdn", "fp32", "sm_100", TABLE).min_work_per_sm == 5
    assert crossovers.entry("gdn", "bf16", "sm_90", TABLE).min_work_per_sm == crossovers.DEFAULT_MIN_WORK_PER_SM
    assert crossovers.entry("kda", "fp32", "sm_90", TABLE).min_work_per_sm == crossovers.DEFAULT_MIN_WORK_PER_SM


def test_a_launch_entry_applies_to_that_launch_only():
    table = TABLE + (Crossover("mamba2", "fp32", "sm_90", 12, fused_min_work_per_sm=0.0, launch="plain"),
                     Crossover("mamba2", "*", "sm_90", 16, launch="plain"))
    assert crossovers.entry("mamba2", "fp32", "sm_90", table, launch="plain").min_work_per_sm == 12
    assert crossovers.entry("mamba2", "fp32", "sm_90", table, launch="programmatic").min_work_per_sm == 8
    assert crossovers.entry("mamba2", "fp32", "sm_90", table).min_work_per_sm == 8  # programmatic by default
    # an exact state label outranks an exact launch, an exact arch both
    assert crossovers.entry("mamba2", "bf16", "sm_90", table, launch="plain").min_work_per_sm == 20
    assert crossovers.entry("mamba2", "fp16", "sm_90", table, launch="plain").min_work_per_sm == 16
    assert crossovers.entry("mamba2", "fp32", "sm_100", table, launch="plain").min_work_per_sm == 3
    assert [crossovers.launch_of(p) for p in (True, False)] == ["programmatic", "plain"]
    with pytest.raises(ValueError, match="launch"):
        crossovers.entry("mamba2", "fp32", "sm_90", table, launch="pdl")


def test_an_entry_may_add_a_fused_band():
    table = crossovers.parse({"entries": [
        dict(family="gdn", state="*", arch="sm_90", min_work_per_sm=8, fused_min_work_per_sm=1.5, source="x"),
        dict(family="gdn", state="bf16", arch="sm_90", min_work_per_sm=10, fused_min_work_per_sm=None)]})
    assert crossovers.entry("gdn", "fp32", "sm_90", table).fused_min_work_per_sm == 1.5
    assert crossovers.entry("gdn", "bf16", "sm_90", table).fused_min_work_per_sm is None
    assert crossovers.entry("kda", "fp32", "sm_90", table) == Crossover("kda", "*", "*", 8)  # the default: no band
    # measured (docs/decisions.md): with programmatic launches fused beats flush below replay for Mamba-2 from about
    # three work items per SM (H200), and with its state tile copied in bulk for GDN from about 0.7 and KDA from about
    # 1.4 (H100); launched plainly (served) for GDN from about 0.5, KDA 1.4 and Mamba-2 2 (H100)
    for launch, low in (("*", 0.5), ("plain", 0.4)):
        bands = {c.family: c.fused_min_work_per_sm for c in crossovers.shipped()
                 if c.state == "fp32" and c.launch == launch and c.fused_min_work_per_sm is not None}
        assert set(bands) == {"mamba2", "gdn", "kda"} and all(low <= band <= 3 for band in bands.values())


# The committed raw sweep each measured entry of the shipped table comes from (benchmarks/results/dev/): (family,
# state, launch) keys: launch "*" for sweeps chained behind the previous call, "plain" for served Mamba-2 ones
# (crossover_sweep.py --served-launch), "programmatic" for those behind the conv1d step (--after-conv).
SWEEPS = {"crossovers-hints-on-small-grids-h200.json": [("mamba2", "fp32", "*")],
          "crossovers-gdn-kda-fp32-h100.json": [("gdn", "fp32", "*"), ("kda", "fp32", "*")],
          "crossovers-mamba2-stored-shipped-h100.json": [("mamba2", s, "*") for s in ("nvfp4", "nvfp4/dual/fp16",
                                                                                    "fp8", "fp8/dual/fp32")],
          "crossovers-delta-stored-h100.json": [(f, s, "*") for f in ("gdn", "kda")
                                                for s in ("nvfp4", "nvfp4/dual/fp16", "fp8", "fp8/dual/fp32")],
          "crossovers-served-h100.json": [(f, s, "plain") for f in ("mamba2", "gdn", "kda") for s in ("fp32", "bf16")],
          "crossovers-after-conv-h100.json": [(f, "bf16", "programmatic") for f in ("gdn", "kda")],
          "crossovers-gdn-kda-after-conv-h200.json": [(f, "fp32", "programmatic") for f in ("gdn", "kda")],
          "crossovers-mamba2-after-conv-h200.json": [("mamba2", "fp32", "programmatic")],
          "crossovers-mamba2-bf16-after-conv-h200.json": [("mamba2", "bf16", "programmatic")]}


def test_every_measured_entry_follows_from_its_committed_sweep():
    """Each non-default entry of the shipped table is what crossover_sweep.py --from-records computes from the raw
    records it was written from (a table edited by hand, or from a sweep not committed, fails here)."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "dev"))
    from crossover_sweep import entries_from

    results = Path(__file__).parents[1] / "benchmarks" / "results" / "dev"
    found = {}
    for name, keys in SWEEPS.items():
        raw = json.loads((results / name).read_text())
        computed = {(e.family, e.state, e.arch, e.launch): e
                    for e in entries_from(raw["records"], raw["gpu"], raw["sms"])}
        found.update({key: computed[key] for key in ((f, s, "sm_90", launch) for f, s, launch in keys)})
    measured = {(c.family, c.state, c.arch, c.launch): c for c in crossovers.shipped() if c.state != "*"}
    assert set(measured) == set(found)
    assert all(measured[key] == found[key] for key in measured)


@pytest.mark.parametrize("entry, match", [(dict(family="rwkv", state="*", arch="*", min_work_per_sm=1), "family"),
                                          (dict(family="gdn", state="*", arch="90", min_work_per_sm=1), "arch"),
                                          (dict(family="gdn", state="*", arch="*", min_work_per_sm=-1), "min_work"),
                                          (dict(family="gdn", state="*", arch="*", min_work_per_sm=1,
                                                fused_min_work_per_sm=-0.5), "fused_min_work"),
                                          (dict(family="gdn", state="*", arch="*", min_work_per_sm=1,
                                                fused_min_work_per_sm="1"), "fused_min_work"),
                                          (dict(family="gdn", state="*", arch="*", min_work_per_sm=1,
                                                launch="served"), "launch")])
def test_bad_entries_are_refused(entry, match):
    with pytest.raises(ValueError, match=match):
        crossovers.parse({"entries": [entry]})
    with pytest.raises(ValueError, match="entries"):
        crossovers.parse({"rows": []})


@pytest.mark.parametrize("family, model", [("mamba2", "nemotron-3-nano-4b"), ("gdn", "qwen3.5-4b")])
@pytest.mark.parametrize("programmatic", [True, False])
def test_the_planner_switches_where_the_table_says(monkeypatch, family, model, programmatic):
    """The planners read the entry of their state kernels' launch (the TensorRT-LLM module's tuning: plain)."""
    dims = get_preset(model).ssm_dims
    fam = get_family(family)
    layer = fam.new_cache(dims, 1, 2, buffer_len=16, device="cpu").layer(0)
    heads, h200, tuning = dims.heads, Device(132, 9), Tuning(programmatic_state=programmatic)
    monkeypatch.delenv("TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD", raising=False)
    entry = crossovers.entry(family, layer.spec.label, h200.arch, launch=crossovers.launch_of(programmatic))
    plan = lambda batch: fam.replay_plan(layer, batch, "auto", tuning, device=h200)  # noqa: E731
    first_replay = math.ceil(entry.min_work_per_sm * 132 / heads)  # batch x heads >= min_work_per_sm x 132 SMs
    assert plan(first_replay - 1).mode in ("flush", "fused")
    assert plan(first_replay).mode == "replay"
    if entry.fused_min_work_per_sm is not None:
        first_fused = max(1, math.ceil(entry.fused_min_work_per_sm * 132 / heads))
        if first_fused > 1:
            assert plan(first_fused - 1).mode == "flush"
        assert plan(first_fused).mode == "fused"
    assert crossovers.entry(family, "fp32", Device(148, 10, 0).arch).min_work_per_sm == crossovers.DEFAULT_MIN_WORK_PER_SM
    asked, table_entry = [], crossovers.entry  # the launch the planner asks the table for
    monkeypatch.setattr(crossovers, "entry", lambda *a, **k: asked.append(k.get("launch")) or table_entry(*a, **k))
    plan(1)
    assert asked == [crossovers.launch_of(programmatic)]


def test_the_sweep_finds_the_first_batch_replay_keeps_winning():
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "dev"))
    from crossover_sweep import crossover

    assert crossover({1: (5.0, 7.0), 8: (20.0, 16.0), 64: (80.0, 50.0)}) == 8
    assert crossover({1: (5.0, 4.0), 8: (20.0, 21.0), 64: (80.0, 50.0)}) == 64  # a win below a loss does not count
    assert crossover({1: (5.0, 7.0), 8: (20.0, 21.0)}) is None


def test_the_sweep_finds_the_fused_band_below_the_replay_crossover():
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "dev"))
    from crossover_sweep import bands

    def t(flush, fused, replay):
        return {"flush": flush, "fused": fused, "replay": replay}

    times = {1: t(4.0, 5.0, 9.0), 8: t(13.0, 9.0, 20.0), 16: t(25.0, 15.0, 22.0), 64: t(80.0, 60.0, 48.0)}
    assert bands(times) == (64, 8)  # replay from 64 (beats fused there), fused from 8 up to it
    times[16] = t(25.0, 15.0, 14.0)
    assert bands(times) == (16, 8)  # replay must beat the better of flush and fused
    assert bands({1: t(4.0, 5.0, 9.0), 8: t(13.0, 14.0, 20.0)}) == (None, None)


def test_the_sweep_places_each_switch_between_the_losing_and_the_winning_batch():
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "dev"))
    from crossover_sweep import switch_per_sm, table_entry

    assert switch_per_sm(8, [1, 4, 8, 16], 132, 132) == pytest.approx(math.sqrt(4 * 8))
    assert switch_per_sm(1, [1, 4, 8], 66, 132) == 0.5 and switch_per_sm(None, [1], 1, 1) is None

    def t(flush, fused, replay):
        return {"flush": flush, "fused": fused, "replay": replay}

    # model a (132 heads): fused from batch 4, replay from 16; model b (66 heads): fused from 2, replay from 32
    a = {1: t(4, 5, 9), 2: t(6, 7, 12), 4: t(10, 9, 18), 8: t(20, 17, 21), 16: t(38, 30, 26), 32: t(70, 55, 45)}
    b = {1: t(4, 5, 9), 2: t(6, 5.5, 12), 4: t(10, 9, 18), 8: t(20, 17, 21), 16: t(38, 30, 31), 32: t(70, 55, 45)}
    e = table_entry("mamba2", "fp32", "sm_90", "GPU", {"a": a, "b": b}, {"a": 132, "b": 66}, 132)
    # replay: a at sqrt(8 x 16) = 11.3, b at sqrt(8 x 16) / 2 = 5.7 (above its losing 8 per SM: 9); fused: a at
    # sqrt(2 x 4) = 2.83, b at sqrt(1 x 2) / 2 = 0.71
    assert (e.min_work_per_sm, e.fused_min_work_per_sm) == (11, 2.82)
    assert table_entry("gdn", "fp32", "sm_90", "GPU", {"a": {1: t(4, 5, 9), 8: t(13, 14, 20)}}, {"a": 1}, 1) is None


def test_the_sweep_times_the_chosen_models_and_hands_over_every_record():
    """--models narrows the sweep to those models (in their families); the raw records go out after each one, so a
    run stopped by a time limit keeps what it measured."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "dev"))
    from crossover_sweep import TIMED_MODES, entries_from, measure

    def fake_time(shape, label, batch, mode):  # fused beats flush from batch 16, replay takes over at 64
        return {"flush": 3.0 * batch, "fused": 2.5 * batch + 3, "replay": 1.5 * batch + 20}[mode]

    seen = []
    records = measure(["mamba2", "gdn"], ["nemotron-3-super-120b", "qwen3.5-4b"], ["nvfp4", "fp32"], [1, 4, 16, 64],
                      "sm_90", fake_time, lambda rs: seen.append(len(rs)))
    assert seen == list(range(1, 2 * 2 * 4 + 1))
    assert {(r["family"], r["model"]) for r in records} == {("mamba2", "nemotron-3-super-120b"), ("gdn", "qwen3.5-4b")}
    assert all(r[f"{m}_us"] == fake_time(None, None, r["batch"], m) for r in records for m in TIMED_MODES)
    entries = {(e.family, e.state): e for e in entries_from(records, "GPU", 132)}
    assert set(entries) == {("mamba2", "nvfp4"), ("mamba2", "fp32"), ("gdn", "nvfp4"), ("gdn", "fp32")}
    assert entries["mamba2", "nvfp4"].fused_min_work_per_sm is not None
    with pytest.raises(ValueError, match="not in the selected families"):
        measure(["gdn"], ["nemotron-3-super-120b"], ["fp32"], [1], "sm_90", fake_time, lambda rs: None)


def test_a_served_sweep_writes_entries_for_plain_launches_only():
    """--served-launch records carry launch 'plain' and make entries for plainly launched state kernels; records
    without a launch (sweeps of programmatic launches) make entries for any launch."""
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "dev"))
    from crossover_sweep import entries_from, measure

    def fake_time(shape, label, batch, mode):  # fused beats flush from batch 1, replay takes over at 16
        return {"flush": 3.0 * batch + 1, "fused": 2.5 * batch, "replay": 1.5 * batch + 20}[mode]

    records = measure(["gdn"], ["qwen3.5-4b"], ["fp32"], [1, 2, 4, 16, 64], "sm_90", fake_time, lambda rs: None,
                      launch="plain")
    assert {r["launch"] for r in records} == {"plain"}
    (served,) = entries_from(records, "GPU", 132)
    assert served.launch == "plain" and "served launch" in served.source
    assert served.fused_min_work_per_sm == math.floor(100 * 32 / 132) / 100  # from batch 1
    (general,) = entries_from([{k: v for k, v in r.items() if k != "launch"} for r in records], "GPU", 132)
    assert general.launch == "*" and "served" not in general.source
    table = (general, served)
    assert crossovers.entry("gdn", "fp32", "sm_90", table, launch="plain") is served
    assert crossovers.entry("gdn", "fp32", "sm_90", table, launch="programmatic") is general
