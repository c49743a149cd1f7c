"""Kernel-source variants of the programmatic state kernels' prologue (development only), for an A/B against the
shipped sources with benchmarks/dev/ab_kernels.py (docs/decisions.md, programmatic state kernels: the L2 hints cost
1-2 µs from about 4 CTAs per SM). Each variant is a copy of plugins/ in which a state kernel reads its guessed slot
and hints L2 only while its grid has at most MAX_HINT_CTAS CTAs; it still waits for the kernel before it.

  python3 benchmarks/dev/prologue_variants.py OUT_DIR [--max-ctas 264,0]
  PYTHONPATH=. python3 benchmarks/dev/ab_kernels.py plugins OUT_DIR/hint_ctas_264 ab.json --state-dtypes fp32 \
      --batches 1,2,4,8,16 --mode auto --models nemotron-3-super-120b,qwen3.5-4b,kimi-linear-48b

(264 = 2 CTAs per SM of the H200's 132; 0: no hints at all.) Fails if the sources no longer hold the text it edits.
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

PLUGINS = Path(__file__).resolve().parents[2] / "plugins"
GRID_CTAS = "gridDim.x * gridDim.y * gridDim.z"
EDITS = {
    "delta_rule_decode.cu": [(
        "  const int slot = rssm::guessed_slot(p.slot_idx, at.b, p.pad_slot_id, p.slots);\n",
        f"  if ({GRID_CTAS} > MAX_HINT_CTAS) return;\n"
        "  const int slot = rssm::guessed_slot(p.slot_idx, at.b, p.pad_slot_id, p.slots);\n")],
    "mamba2_decode.cu": [(
        "  const int slot = rssm::guessed_slot(p.slot_idx, blockIdx.z, p.pad_slot_id, p.slots);\n",
        f"  const int slot = {GRID_CTAS} > MAX_HINT_CTAS\n"
        "                       ? p.pad_slot_id : rssm::guessed_slot(p.slot_idx, blockIdx.z, p.pad_slot_id, p.slots);\n")],
}


def write_variant(out: Path, max_ctas: int) -> Path:
    """plugins/ copied to ``out``/hint_ctas_<max_ctas> with the edits of EDITS and MAX_HINT_CTAS defined."""
    dst = out / f"hint_ctas_{max_ctas}"
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(PLUGINS, dst)
    for name, edits in EDITS.items():
        path = dst / name
        text = path.read_text()
        for old, new in edits:
            if text.count(old) != 1:
                raise SystemExit(f"{name}: expected the text to edit once, found it {text.count(old)} times: {old!r}")
            text = text.replace(old, new)
        path.write_text(f"#define MAX_HINT_CTAS {max_ctas}\n" + text)
    return dst


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--max-ctas", default="264,0", help="comma-separated MAX_HINT_CTAS values, one variant each")
    a = ap.parse_args()
    for n in map(int, a.max_ctas.split(",")):
        print(write_variant(a.out, n))
    return 0


if __name__ == "__main__":
    sys.exit(main())
