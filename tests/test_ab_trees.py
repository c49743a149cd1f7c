"""benchmarks/dev/ab_trees.py pairs the records of runs in two source trees (the command here writes fake timings)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "dev" / "ab_trees.py"
# Writes one record whose time says which tree ran it (tree "b" runs half as long) and which run it was.
FAKE = ("import json, os, sys; n = len(os.listdir('.')) - 1; "
        "json.dump({'records': [{'family': 'mamba2', 'batch': 8, 'median_us': (1.0 if 'b' in os.getcwd()[-1] else 2.0)"
        " + n}]}, open(sys.argv[1], 'w')); open(f'run{n}', 'w').close()")


def _trees(tmp_path: Path) -> tuple[Path, Path]:
    trees = tmp_path / "a", tmp_path / "b"
    for tree in trees:
        (tree / "trtllm_replayssm").mkdir(parents=True)
    return trees


def test_rounds_pair_by_key_with_options_after_the_trees(tmp_path):
    a, b = _trees(tmp_path)
    out = tmp_path / "ab.json"
    subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), str(out), "--rounds", "3", "--",
                    sys.executable, "-c", FAKE, "{out}"], check=True, capture_output=True)
    data = json.loads(out.read_text())
    assert data["rounds"] == 3
    (row,) = data["rows"]
    assert (row["family"], row["batch"]) == ("mamba2", 8)
    assert row["a"] == [2.0, 3.0, 4.0] and row["b"] == [1.0, 2.0, 3.0]
    assert row["a_median"] == 3.0 and row["b_median"] == 2.0 and row["b_over_a"] == pytest.approx(2 / 3)


# Two tunings of one case (flush_ctas 4 and 8), tree "b" half as long, tuning 8 ten more.
FAKE_TUNINGS = ("import json, os, sys; t = 1.0 if 'b' in os.getcwd()[-1] else 2.0; "
                "json.dump([{'family': 'mamba2', 'batch': 8, 'flush_ctas': n, 'median_us': t + (10 if n == 8 else 0)}"
                " for n in (4, 8)], open(sys.argv[1], 'w'))")


@pytest.mark.parametrize("also_key, pairs", [
    ([], {None: ([2.0, 12.0], [1.0, 11.0])}),
    (["--also-key", "flush_ctas"], {4: ([2.0], [1.0]), 8: ([12.0], [11.0])}),
])
def test_swept_tunings_pair_apart_with_also_key(tmp_path, also_key, pairs):
    a, b = _trees(tmp_path)
    out = tmp_path / "ab.json"
    done = subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), str(out), "--rounds", "1", *also_key, "--",
                           sys.executable, "-c", FAKE_TUNINGS, "{out}"], check=True, capture_output=True, text=True)
    rows = json.loads(out.read_text())["rows"]
    assert {row.get("flush_ctas"): (row["a"], row["b"]) for row in rows} == pairs
    assert ("flush_ctas=4" in done.stdout) == bool(also_key)


@pytest.mark.parametrize("args, message", [
    (["--rounds", "0", "--", "x", "{out}"], "--rounds"),
    (["--", "x"], "{out}"),
    (["--precompile", "nemotron-3-nano-4b", "fp32", "--", "x", "{out}"], "--precompile"),
])
def test_bad_arguments_are_named(tmp_path, args, message):
    a, b = _trees(tmp_path)
    done = subprocess.run([sys.executable, str(SCRIPT), str(a), str(b), str(tmp_path / "ab.json"), *args],
                          capture_output=True, text=True)
    assert done.returncode == 2 and message in done.stderr
