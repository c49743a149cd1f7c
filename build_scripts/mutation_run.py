"""Mutation run (development): small AST mutants of the slot, cache, check, serving-core, module-install,
memory-plan and bundle modules, each run against the tests of its module; reports killed / survived and writes every
mutant to JSON.

    python3 build_scripts/mutation_run.py [-o benchmarks/results/mutation-cpu.json] [--modules cache,checks]
        [--jobs 2] [--limit N] [--merge PREVIOUS.json]

``--merge``: the modules not run now keep their mutants from a previous report. ``--resume``: a module whose mutants
are those of a previous report (same lines and operators, in order: its code is unchanged) keeps the killed ones and
re-runs only its survivors (after tests were added).

Operators: comparison swaps (< <=, > >=, == !=, in / not in, is / is not), + -, and / or, dropping a ``not``,
integer constants n -> n + 1, True / False, a call statement removed, a guard ``if ...: raise`` removed. Strings and
f-strings (error messages) are not mutated. A mutant is killed when its tests fail or time out. Mutants listed in
``build_scripts/mutation_equivalent.txt`` (``module:line:operator  reason``) are equivalent to the original and are
not counted.
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# module (path under the package) -> the tests that exercise it
TARGETS: dict[str, tuple[str, list[str]]] = {
    "cache": ("trtllm_replayssm/core/cache.py",
              ["tests/test_cache_slots.py", "tests/test_row_contract.py", "tests/test_trtllm_model_cache.py"]),
    "checks": ("trtllm_replayssm/core/checks.py",
               ["tests/test_checks.py", "tests/test_row_contract.py", "tests/test_cache_slots.py",
                "tests/test_gdn_kda_ops_cpu.py::test_gdn_bad_input_errors_name_the_argument",
                "tests/test_gdn_kda_ops_cpu.py::test_kda_bad_input_errors_name_the_argument",
                "tests/test_reference_mamba2.py::test_bad_input_errors_name_the_argument"]),
    "serving_core": ("trtllm_replayssm/serving/trtllm/core.py",
                     ["tests/test_trtllm_core_contract.py", "tests/test_cache_slots.py", "tests/test_trtllm_core.py",
                      "tests/test_trtllm_model_cache.py", "tests/test_serving_loop.py"]),
    "install": ("trtllm_replayssm/serving/trtllm/install.py", ["tests/test_trtllm_model_cache.py"]),
    "memory_plan": ("trtllm_replayssm/serving/memory_plan.py",
                    ["tests/test_memory_plan.py", "tests/test_cache_slots.py", "tests/test_bundle_cli.py"]),
    "bundle": ("trtllm_replayssm/serving/bundle.py",
               ["tests/test_bundle_parts.py", "tests/test_bundle_cli.py", "tests/test_cache_slots.py"]),
}
DESELECT = ["tests/test_bundle_cli.py::test_compile_prints_the_kernel_cache"]  # compiles kernels: 35 s, no plan logic
EQUIVALENT_FILE = REPO / "build_scripts" / "mutation_equivalent.txt"
_CMP_SWAPS = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt, ast.Eq: ast.NotEq,
              ast.NotEq: ast.Eq, ast.In: ast.NotIn, ast.NotIn: ast.In, ast.Is: ast.IsNot, ast.IsNot: ast.Is}
_BIN_SWAPS = {ast.Add: ast.Sub, ast.Sub: ast.Add}


@dataclass
class Mutant:
    module: str
    line: int
    operator: str
    source: str = ""
    status: str = "pending"  # killed, survived, equivalent
    seconds: float = 0.0

    @property
    def key(self) -> str:
        return f"{self.module}:{self.line}:{self.operator}"


def _string_nodes(tree: ast.AST) -> set[int]:
    """ids of nodes inside f-strings and docstrings (never mutated)."""
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skip.update(id(n) for n in ast.walk(node))
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                skip.update(id(n) for n in ast.walk(first))
    return skip


def _sites(tree: ast.AST) -> list[tuple[ast.AST, str, object]]:
    """(node, operator name, how) for every mutation site."""
    skip, sites = _string_nodes(tree), []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _CMP_SWAPS:
                    sites.append((node, f"{type(op).__name__}->{_CMP_SWAPS[type(op)].__name__}", ("cmp", i)))
        elif isinstance(node, ast.BinOp) and type(node.op) in _BIN_SWAPS:
            sites.append((node, f"{type(node.op).__name__}->{_BIN_SWAPS[type(node.op)].__name__}", ("bin",)))
        elif isinstance(node, ast.BoolOp):
            sites.append((node, "And->Or" if isinstance(node.op, ast.And) else "Or->And", ("bool",)))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            sites.append((node, "drop not", ("not",)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            sites.append((node, f"{node.value}->{not node.value}", ("boolconst",)))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            sites.append((node, f"{node.value}->{node.value + 1}", ("int",)))
        elif isinstance(node, ast.Expr) and isinstance(node.value, ast.Call):
            sites.append((node, "drop call", ("dropcall",)))
        elif (isinstance(node, ast.If) and not node.orelse and len(node.body) == 1
              and isinstance(node.body[0], ast.Raise)):
            sites.append((node, "drop guard", ("dropguard",)))
    return sites


class _Apply(ast.NodeTransformer):
    def __init__(self, target: ast.AST, how: tuple):
        self.target, self.how = target, how

    def visit(self, node):
        if node is not self.target:
            return super().visit(node)
        kind = self.how[0]
        if kind == "cmp":
            node.ops[self.how[1]] = _CMP_SWAPS[type(node.ops[self.how[1]])]()
        elif kind == "bin":
            node.op = _BIN_SWAPS[type(node.op)]()
        elif kind == "bool":
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif kind == "not":
            return node.operand
        elif kind == "boolconst":
            node.value = not node.value
        elif kind == "int":
            node.value = node.value + 1
        elif kind in ("dropcall", "dropguard"):
            return ast.Pass()
        return node


def mutants_of(module: str, path: Path) -> list[Mutant]:
    text = path.read_text()
    out = []
    tree = ast.parse(text)
    for index, (node, name, how) in enumerate(_sites(tree)):
        fresh = ast.parse(text)
        target = _sites(fresh)[index][0]
        mutated = ast.fix_missing_locations(_Apply(target, how).visit(fresh))
        out.append(Mutant(module, node.lineno, name, ast.unparse(mutated)))
    return out


def _equivalent() -> dict[str, str]:
    if not EQUIVALENT_FILE.exists():
        return {}
    table = {}
    for line in EQUIVALENT_FILE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, reason = line.partition("  ")
            table[key.strip()] = reason.strip()
    return table


def _run(mutant: Mutant, workdir: Path, tests: list[str], rel_path: str, timeout: float) -> None:
    target = workdir / rel_path
    original = target.read_text()
    target.write_text(mutant.source)
    start = time.time()
    try:
        deselect = [a for d in DESELECT for a in ("--deselect", d)]
        proc = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *deselect, *tests],
                              cwd=workdir, capture_output=True, timeout=timeout,
                              env={**os.environ, "PYTHONPATH": str(workdir), "PYTHONDONTWRITEBYTECODE": "1"})
        mutant.status = "survived" if proc.returncode == 0 else "killed"
    except subprocess.TimeoutExpired:
        mutant.status = "killed"
    finally:
        target.write_text(original)
    mutant.seconds = round(time.time() - start, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("-o", "--output", default=str(REPO / "benchmarks" / "results" / "mutation-cpu.json"))
    ap.add_argument("--modules", default=",".join(TARGETS))
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--limit", type=int, default=0, help="at most this many mutants per module (0: all)")
    ap.add_argument("--timeout", type=float, default=300.0)
    ap.add_argument("--merge", help="a previous report: its modules not run now are kept")
    ap.add_argument("--resume", help="a previous report: unchanged modules re-run only their survivors")
    args = ap.parse_args()
    equivalent = _equivalent()
    work = Path(tempfile.mkdtemp(prefix="mutation-"))
    workers = []
    for j in range(args.jobs):  # one copy of the repository per worker
        dst = work / f"w{j}"
        shutil.copytree(REPO, dst, ignore=shutil.ignore_patterns(".git", ".whl", "build", "benchmarks", "__pycache__",
                                                                 "*.egg-info", "gpu_out"))
        workers.append(dst)
    mutants: list[tuple[Mutant, list[str], str]] = []
    for module in args.modules.split(","):
        rel, tests = TARGETS[module]
        found = mutants_of(module, REPO / rel)
        mutants += [(m, tests, rel) for m in (found[:args.limit] if args.limit else found)]
    if args.resume:
        before: dict[str, list[dict]] = {}
        for row in json.loads(Path(args.resume).read_text())["mutants"]:
            before.setdefault(row["module"], []).append(row)
        for module, rows in before.items():
            now = [m for m, _, _ in mutants if m.module == module]
            if [(r["line"], r["operator"]) for r in rows] == [(m.line, m.operator) for m in now]:
                for m, r in zip(now, rows):
                    if r["status"] == "killed":
                        m.status = "killed"
    todo = []
    for m, tests, rel in mutants:
        if m.status == "killed":
            continue
        if m.key in equivalent:
            m.status = "equivalent"
        else:
            todo.append((m, tests, rel))
    marked = sum(m.status == "equivalent" for m, _, _ in mutants)
    print(f"{len(mutants)} mutants, {marked} marked equivalent, {len(mutants) - marked - len(todo)} killed before, "
          f"{len(todo)} to run", flush=True)
    free = list(workers)

    def job(item):
        m, tests, rel = item
        wd = free.pop()
        try:
            _run(m, wd, tests, rel, args.timeout)
        finally:
            free.append(wd)
        print(f"{m.status:9s} {m.key} ({m.seconds} s)", flush=True)

    with ThreadPoolExecutor(args.jobs) as pool:
        list(pool.map(job, todo))
    shutil.rmtree(work, ignore_errors=True)
    if args.merge:
        run_now = set(args.modules.split(","))
        kept = [Mutant(**{k: v for k, v in row.items() if k != "key"})
                for row in json.loads(Path(args.merge).read_text())["mutants"] if row["module"] not in run_now]
        mutants += [(m, [], "") for m in kept]
    counted = [m for m, _, _ in mutants if m.status != "equivalent"]
    killed = sum(m.status == "killed" for m in counted)
    per_module = {}
    for m, _, _ in mutants:
        row = per_module.setdefault(m.module, {"killed": 0, "survived": 0, "equivalent": 0})
        row[m.status] += 1
    score = killed / len(counted) if counted else 1.0
    report = {"score": round(score, 4), "killed": killed, "counted": len(counted), "per_module": per_module,
              "survivors": [m.key for m in counted if m.status == "survived"],
              "mutants": [{k: v for k, v in asdict(m).items() if k != "source"} for m, _, _ in mutants]}
    Path(args.output).write_text(json.dumps(report, indent=1))
    for name, row in per_module.items():
        print(f"{name:14s} killed {row['killed']:4d}  survived {row['survived']:4d}  equivalent {row['equivalent']:4d}")
    print(f"score {100 * score:.1f}% ({killed}/{len(counted)} non-equivalent mutants killed) -> {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
