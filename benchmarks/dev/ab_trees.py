"""Cross-process A/B of two source trees (development): runs a benchmark command in tree A and tree B alternately
(ABAB..., ``--rounds`` each), each run in its tree with the tree first on PYTHONPATH, and pairs the JSON records the
runs write by their key fields: medians per tree and their ratio B/A. For changes that touch the Python side as well
as the kernels (``ab_kernels.py`` swaps kernel sources within one process and needs the same Python side). Both trees
share one kernel cache: cubins are keyed by their sources. ``--precompile MODELS SPECS`` first compiles those
presets' modules of both trees side by side on every core (``build_scripts/precompile_test_kernels.py``). A command
that times several tunings of one case (``quant_speed.py --flush-ctas 4,8``) names the record fields that tell them
apart with ``--also-key`` (``flush_ctas``). OUT.json is rewritten after every run, so a run stopped by a time limit
keeps the pairs of the rounds before it.

    python3 benchmarks/dev/ab_trees.py TREE_A TREE_B OUT.json [--rounds 2] [--value median_us] \\
        [--precompile nemotron-3-super-120b fp32,nvfp4] [--also-key flush_ctas,rows_per_cta] -- \\
        python3 benchmarks/dev/quant_speed.py -o {out} --batches 256 --specs nvfp4 --phases cycle,nonflush

``{out}`` in the command is each run's JSON file (a list of records, or an object with a ``records`` list). A tree is
``git archive REF trtllm_replayssm plugins benchmarks/dev build_scripts | tar -x -C DIR`` of a branch.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

KEY_FIELDS = ("family", "model", "impl", "batch", "state_dtype", "state_format", "state_mode", "master_format",
              "stochastic_rounding", "phase", "mode", "spec_tokens", "L")
PRECOMPILE = "build_scripts/precompile_test_kernels.py"


def records(path: Path) -> list[dict]:
    data = json.loads(path.read_text())
    return data["records"] if isinstance(data, dict) else data


def key_of(record: dict, fields: tuple[str, ...] = KEY_FIELDS) -> tuple:
    return tuple((name, record[name]) for name in fields if name in record)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 usage="%(prog)s TREE_A TREE_B OUT [options] -- COMMAND ... {out} ...")
    ap.add_argument("tree_a", type=Path)
    ap.add_argument("tree_b", type=Path)
    ap.add_argument("out", type=Path)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--value", default="median_us", help="the timed field of a record")
    ap.add_argument("--precompile", nargs=2, metavar=("MODELS", "SPECS"),
                    help="compile these presets' modules with these state specs in both trees first")
    ap.add_argument("--also-key", default="", metavar="FIELD[,FIELD]",
                    help="record fields that tell a case's runs apart besides the case fields (swept tunings)")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args, command = ap.parse_args(argv[:split]), argv[split + 1:]
    if not command or not any("{out}" in part for part in command):
        ap.error("command: expected '-- COMMAND ...' with {out} where the run writes its JSON records")
    for tree in (args.tree_a, args.tree_b):
        if not (tree / "trtllm_replayssm").is_dir():
            ap.error(f"{tree}: expected a source tree (a trtllm_replayssm/ folder in it)")
    if args.rounds < 1:
        ap.error(f"--rounds: expected at least 1, got {args.rounds}")
    fields = KEY_FIELDS + tuple(name for name in args.also_key.split(",") if name and name not in KEY_FIELDS)
    trees = {"a": args.tree_a, "b": args.tree_b}
    if args.precompile:
        if not all((tree / PRECOMPILE).is_file() for tree in trees.values()):
            ap.error(f"--precompile: expected {PRECOMPILE} in both trees")
        models, specs = args.precompile
        procs = [subprocess.Popen([sys.executable, PRECOMPILE, "--models", models,
                                   "--specs", specs], cwd=tree, env=_tree_env(tree)) for tree in trees.values()]
        if any(proc.wait() for proc in procs):
            print("precompile failed in a tree", file=sys.stderr)
            return 1
    times: dict[tuple, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="ab_trees.") as tmp:
        for rnd in range(args.rounds):
            for name, tree in trees.items():
                out = Path(tmp) / f"{name}{rnd}.json"
                cmd = [part.replace("{out}", str(out)) for part in command]
                print(f"round {rnd + 1}, tree {name.upper()}: {' '.join(cmd)}", flush=True)
                subprocess.run(cmd, cwd=tree, env=_tree_env(tree), check=True)
                for record in records(out):
                    if args.value in record:
                        times.setdefault(key_of(record, fields), {"a": [], "b": []})[name].append(record[args.value])
                rows = paired_rows(times)
                args.out.write_text(json.dumps({"tree_a": str(args.tree_a), "tree_b": str(args.tree_b),
                                                "value": args.value, "rounds": rnd + 1, "command": command,
                                                "rows": rows}, indent=1))
    for row in rows:
        label = " ".join(f"{k}={v}" for k, v in row.items() if k in fields)
        print(f"{label}: A {row['a_median']:.2f}  B {row['b_median']:.2f}  B/A {row['b_over_a']:.3f}")
    return 0


def _tree_env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(tree.resolve()),
                                                                      os.environ.get("PYTHONPATH"))))}


def paired_rows(times: dict[tuple, dict[str, list[float]]]) -> list[dict]:
    """One row per key timed in both trees: the values, their medians and the ratio B/A."""
    rows = []
    for key, both in times.items():
        if both["a"] and both["b"]:
            a, b = statistics.median(both["a"]), statistics.median(both["b"])
            rows.append({**dict(key), "a": both["a"], "b": both["b"], "a_median": a, "b_median": b, "b_over_a": b / a})
    return rows


if __name__ == "__main__":
    sys.exit(main())
