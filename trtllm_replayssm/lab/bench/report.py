"""Kernel benchmark reports: markdown summary tables and a PNG of replay speed-up vs batch."""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from trtllm_replayssm.lab.plotting import PlotUnavailable, pyplot, save_figure

PEER_IMPLS = ("flashinfer_ssu", "flashinfer_checkpointing_ssu", "mamba_ssm_ssu", "fla_gdn", "fla_kda", "fla_gdn_pooled")
REQUIRED_KEYS = ("device", "date", "copy_ceiling_gbps", "records")
RECORD_KEYS = ("family", "model", "impl", "batch", "state_dtype", "L", "median_us", "model_gbps", "pct_of_copy")


# What each call followed (KernelBenchConfig.neighbour; records from before the field: a plain kernel)
NEIGHBOUR_TEXT = {"plain": "a plainly launched elementwise kernel",
                  "conv": "our conv1d decode step (which lets the next kernel launch early)"}

def load_results(path: str | Path) -> dict:
    """Read and validate a results JSON written by ``bench kernels``."""
    data = json.loads(Path(path).read_text())
    validate_results(data)
    return data


def validate_results(results: dict) -> None:
    """Raise ValueError naming the first missing key of the results or of a record."""
    missing = [k for k in REQUIRED_KEYS if k not in results]
    if missing:
        raise ValueError(f"results: missing keys {missing}")
    for i, rec in enumerate(results["records"]):
        gone = [k for k in RECORD_KEYS if k not in rec]
        if gone:
            raise ValueError(f"results.records[{i}]: missing keys {gone}")


def _label(rec: dict) -> str:
    label = rec["impl"]
    if rec.get("mode"):
        label += f"/{rec['mode']}"
    return label


def replay_time(records: list[dict]) -> float | None:
    """Our replay time at one point: the ``auto`` record when present (what callers get), else ``replay``."""
    by_mode = {r.get("mode"): r["median_us"] for r in records if r["impl"] == "replay"}
    return by_mode.get("auto", by_mode.get("replay"))


def speedups(results: dict) -> list[dict]:
    """Per (family, model, state_dtype, batch): replay over our baseline and over the fastest peer."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for rec in results["records"]:
        groups[(rec["family"], rec["model"], rec["state_dtype"], rec["batch"])].append(rec)
    rows = []
    for (family, model, sd, batch), recs in sorted(groups.items()):
        ours = replay_time(recs)
        if ours is None:
            continue
        base = [r["median_us"] for r in recs if r["impl"] == "baseline"]
        peer = min((r for r in recs if r["impl"] in PEER_IMPLS), key=lambda r: r["median_us"], default=None)
        rows.append({
            "family": family, "model": model, "state_dtype": sd, "batch": batch, "replay_us": ours,
            "vs_baseline": base[0] / ours if base else None,
            "vs_best_peer": peer["median_us"] / ours if peer else None,
            "best_peer": peer["impl"] if peer else None,
        })
    return rows


def summary_markdown(results: dict) -> str:
    """Markdown: run header, then per (model, state dtype) µs per call (and % of copy ceiling) by impl x batch."""
    validate_results(results)
    lines = [
        f"# Kernel benchmark — {results['device']}, {results['date']}",
        "",
        f"Copy ceiling (same run): **{results['copy_ceiling_gbps']:.0f} GB/s**. "
        f"L = {results.get('buffer_len', '?')}. Peer versions: "
        + ", ".join(f"{k} {v}" for k, v in (results.get("peer_versions") or {}).items()) + ".",
        "Cells: µs per call (% of the copy ceiling on the byte model). Speed-up rows: replay (auto mode where "
        "recorded) over our baseline / over the fastest peer.",
        "",
    ]
    kinds = {r.get("neighbour") or "plain" for r in results["records"] if r.get("neighbour_us") is not None}
    if kinds:
        before = " or ".join(NEIGHBOUR_TEXT[k] for k in sorted(kinds))
        lines[-1:-1] = [f"Each call followed {before}, whose own time (timed alone) is subtracted from the cells."]
    tables: dict[tuple, list[dict]] = defaultdict(list)
    for rec in results["records"]:
        tables[(rec["family"], rec["model"], rec["state_dtype"])].append(rec)
    sp = {(r["model"], r["state_dtype"], r["batch"]): r for r in speedups(results)}
    for (family, model, sd), recs in tables.items():
        batches = sorted({r["batch"] for r in recs})
        lines += [f"## {model} ({family}), {sd} state", "",
                  "| impl | " + " | ".join(f"b={b}" for b in batches) + " |",
                  "|---|" + "---|" * len(batches)]
        cells: dict[str, dict[int, str]] = defaultdict(dict)
        for r in recs:
            cells[_label(r)][r["batch"]] = f"{r['median_us']:.1f} ({r['pct_of_copy']:.0f}%)"
        for label, row in cells.items():
            lines.append(f"| {label} | " + " | ".join(row.get(b, "—") for b in batches) + " |")
        for key, name in (("vs_baseline", "speed-up vs baseline"), ("vs_best_peer", "speed-up vs best peer")):
            vals = []
            for b in batches:
                s = sp.get((model, sd, b))
                v = s[key] if s else None
                vals.append("—" if v is None else f"{v:.2f}×" + (f" ({s['best_peer']})" if key == "vs_best_peer"
                                                                  else ""))
            lines.append(f"| **{name}** | " + " | ".join(vals) + " |")
        lines.append("")
    if results.get("skipped"):
        lines += ["## Skipped", ""]
        for s in results["skipped"]:
            lines.append(f"- {s['impl']} {s['model']} {s['state_dtype']} b={s['batch']}: {s['reason']}")
        lines.append("")
    return "\n".join(lines)


def plot_speedups(results: dict, path: str | Path) -> Path:
    """PNG: one panel per model, replay speed-up vs batch over our baseline (solid) and the best peer (dashed)."""
    plt = pyplot()

    rows = speedups(results)
    if not rows:
        raise ValueError("results: no replay records to plot")
    models = sorted({r["model"] for r in rows})
    ncols = min(3, len(models))
    nrows = (len(models) + ncols - 1) // ncols
    fig, axes = plt.subplots(nrows, ncols, figsize=(5 * ncols, 3.6 * nrows), squeeze=False)
    for ax, model in zip(axes.flat, models):
        for sd in sorted({r["state_dtype"] for r in rows if r["model"] == model}):
            pts = sorted((r for r in rows if r["model"] == model and r["state_dtype"] == sd), key=lambda r: r["batch"])
            for key, style, name in (("vs_baseline", "-o", "vs baseline"), ("vs_best_peer", "--s", "vs best peer")):
                xy = [(r["batch"], r[key]) for r in pts if r[key] is not None]
                if xy:
                    ax.plot(*zip(*xy), style, label=f"{sd} {name}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(model)
        ax.set_xlabel("batch")
        ax.set_ylabel("replay speed-up")
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(models):]:
        ax.set_visible(False)
    fig.suptitle(f"ReplaySSM decode speed-up — {results['device']}")
    return save_figure(fig, path)


def write_reports(results: dict, json_path: str | Path) -> tuple[Path, Path, Path | None]:
    """Write results JSON, the markdown summary (``.md``) and the plot (``.png``, when there are replay records and
    matplotlib is installed; None otherwise)."""
    jp = Path(json_path)
    jp.parent.mkdir(parents=True, exist_ok=True)
    jp.write_text(json.dumps(results, indent=1))
    md = jp.with_suffix(".md")
    md.write_text(summary_markdown(results))
    try:
        png = plot_speedups(results, jp.with_suffix(".png")) if speedups(results) else None
    except PlotUnavailable:
        png = None
    return jp, md, png
