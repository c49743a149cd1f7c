"""Static SASS of kernel modules, loop by loop (development only; no GPU needed): compiles the modules of model
presets x state specs with NVRTC, disassembles them with ``cuobjdump`` (the ``nvidia-cuda-cuobjdump`` wheel holds
one) and prints, per kernel matching ``--kernel``, its instruction count and every loop (a backward branch and the
instructions it spans; nested loops print separately) with its instruction count and most frequent opcodes. For
issue-bound kernels the instructions of their hot loops are what a change has to cut, so two source trees can be
compared before any GPU time is spent ($TRTLLM_REPLAYSSM_PLUGIN_DIR compiles another tree's sources).

  PYTHONPATH=. python3 benchmarks/dev/sass_loops.py --models nemotron-3-super-120b --specs nvfp4/dual/fp16 \\
      --kernel replay_flush [--param pt=128] [--arch sm_90a] [--min-loop 40]
"""
from __future__ import annotations

import argparse
import collections
import re
import shutil
import subprocess

from trtllm_replayssm.core.jit.compiler import compile_config
from trtllm_replayssm.serving.catalog import label_configs

INSTRUCTION = re.compile(r"^\s+/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;")
BRANCH = re.compile(r"\bBRA\b.*?0x([0-9a-f]+)")
PREDICATE = re.compile(r"^@!?U?P[T0-9]+\s+")


def opcode(text: str) -> str:
    """The opcode of one SASS instruction without its predicate and modifiers (``FFMA.FTZ`` -> ``FFMA``)."""
    return PREDICATE.sub("", text).split()[0].split(".")[0]


def functions(sass: str) -> dict[str, list[tuple[int, str]]]:
    """Each function's (address, instruction) list from ``cuobjdump -sass`` output."""
    out: dict[str, list[tuple[int, str]]] = {}
    current = None
    for line in sass.splitlines():
        if "Function :" in line:
            current = out.setdefault(line.split("Function :")[1].strip(), [])
        elif current is not None and (m := INSTRUCTION.match(line)):
            current.append((int(m.group(1), 16), m.group(2)))
    return out


def loops(code: list[tuple[int, str]]) -> list[tuple[int, int]]:
    """(first, last) instruction indices of every backward branch's span."""
    index = {addr: i for i, (addr, _) in enumerate(code)}
    spans = []
    for i, (addr, text) in enumerate(code):
        m = BRANCH.search(text)
        if m and (target := int(m.group(1), 16)) <= addr and target in index:
            spans.append((index[target], i))
    return sorted(spans)


def report(name: str, code: list[tuple[int, str]], min_loop: int, top: int) -> None:
    ops = collections.Counter(opcode(t) for _, t in code)
    print(f"{name}: {len(code)} instructions; {', '.join(f'{o} {n}' for o, n in ops.most_common(top))}")
    for first, last in loops(code):
        if last - first + 1 < min_loop:
            continue
        body = collections.Counter(opcode(t) for _, t in code[first:last + 1])
        print(f"  loop [{first}, {last}] {last - first + 1} instructions: "
              f"{', '.join(f'{o} {n}' for o, n in body.most_common(top))}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--models", required=True, help="comma-separated model presets")
    ap.add_argument("--specs", required=True, help="comma-separated state specs, e.g. fp32,nvfp4/dual/fp16")
    ap.add_argument("--kernel", default="", help="regex the kernel names must match (default: every kernel)")
    ap.add_argument("--param", action="append", default=[], help="NAME=VALUE a module's parameter must have "
                    "(e.g. pt=128, the Mamba-2 row tile); repeatable")
    ap.add_argument("--arch", default="sm_90a")
    ap.add_argument("--min-loop", type=int, default=40, help="shortest loop to print (instructions)")
    ap.add_argument("--top", type=int, default=10, help="opcodes per line")
    args = ap.parse_args()
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        raise SystemExit("cuobjdump: not on PATH (pip download nvidia-cuda-cuobjdump; its bin/ holds one)")
    wanted = dict(p.split("=", 1) for p in args.param)
    kernel = re.compile(args.kernel)
    for config in label_configs(args.models.split(","), args.specs.split(","), "--specs"):
        params = {k: str(v) for k, v in config.params}
        if any(params.get(k) != v for k, v in wanted.items()):
            continue
        cubin = compile_config(config, args.arch).cubin_path
        sass = subprocess.run([cuobjdump, "-sass", str(cubin)], check=True, capture_output=True, text=True).stdout
        print(f"== {config.name} ({args.arch})")
        for name, code in functions(sass).items():
            if kernel.search(name):
                report(name, code, args.min_loop, args.top)


if __name__ == "__main__":
    main()
