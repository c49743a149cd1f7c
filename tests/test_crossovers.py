"""CPU: the crossover table mode='auto' reads (core/crossovers.py): the shipped table parses, the most specific entry
wins, a family or arch without an entry gets the default, bad entries are refused, and the planners switch where the
table says."""
import json
import sys
from pathlib import Path

import pytest

from trtllm_replayssm.core import crossovers
from trtllm_replayssm.core.crossovers import Crossover
from trtllm_replayssm.core.families import get_family
from trtllm_replayssm.core.plans import Device
from trtllm_replayssm.serving.presets import get_preset

TABLE = (Crossover("mamba2", "*", "*", 3), Crossover("mamba2", "*", "sm_90", 8), Crossover("mamba2", "bf16", "sm_90", 20),
         Crossover("gdn", "fp32", "*", 5))


def test_the_shipped_table_parses_and_covers_every_family_on_hopper():
    table = crossovers.parse(json.loads(crossovers.TABLE.read_text()))
    assert {c.family for c in table if c.arch == "sm_90"} == set(crossovers.FAMILIES)
    assert all(c.source for c in table)


def test_the_most_specific_entry_wins():
    assert crossovers.min_work_per_sm("mamba2", "bf16", "sm_90", TABLE) == 20
    assert crossovers.min_work_per_sm("mamba2", "fp32", "sm_90", TABLE) == 8
    assert crossovers.min_work_per_sm("mamba2", "fp32", "sm_100", TABLE) == 3
    assert crossovers.min_work_per_sm("gdn", "fp32", "sm_100", TABLE) == 5
    assert crossovers.min_work_per_sm("gdn", "bf16", "sm_90", TABLE) == crossovers.DEFAULT_MIN_WORK_PER_SM
    assert crossovers.min_work_per_sm("kda", "fp32", "sm_90", TABLE) == crossovers.DEFAULT_MIN_WORK_PER_SM


@pytest.mark.parametrize("entry, match", [(dict(family="rwkv", state="*", arch="*", min_work_per_sm=1), "family"),
                                          (dict(family="gdn", state="*", arch="90", min_work_per_sm=1), "arch"),
                                          (dict(family="gdn", state="*", arch="*", min_work_per_sm=-1), "min_work")])
def test_bad_entries_are_refused(entry, match):
    with pytest.raises(ValueError, match=match):
        crossovers.parse({"entries": [entry]})
    with pytest.raises(ValueError, match="entries"):
        crossovers.parse({"rows": []})


def test_the_planner_switches_where_the_table_says(monkeypatch):
    dims = get_preset("nemotron-3-nano-4b").ssm_dims  # 96 heads
    fam = get_family("mamba2")
    layer = fam.new_cache(dims, 1, 2, buffer_len=16, device="cpu").layer(0)
    h200 = Device(132, 9)
    monkeypatch.delenv("TRTLLM_REPLAYSSM_ADAPTIVE_THRESHOLD", raising=False)
    # 8 per SM on Hopper: 1056 work items = batch 11 of 96 heads
    assert fam.replay_plan(layer, 10, "auto", device=h200).mode == "flush"
    assert fam.replay_plan(layer, 11, "auto", device=h200).mode == "replay"
    assert crossovers.min_work_per_sm("mamba2", "fp32", Device(148, 10, 0).arch) == crossovers.DEFAULT_MIN_WORK_PER_SM


def test_the_sweep_finds_the_first_batch_replay_keeps_winning():
    sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks" / "dev"))
    from crossover_sweep import crossover

    assert crossover({1: (5.0, 7.0), 8: (20.0, 16.0), 64: (80.0, 50.0)}) == 8
    assert crossover({1: (5.0, 4.0), 8: (20.0, 21.0), 64: (80.0, 50.0)}) == 64  # a win below a loss does not count
    assert crossover({1: (5.0, 7.0), 8: (20.0, 21.0)}) is None
