"""Model-level decode-step comparison, baseline SSM op vs ReplaySSM, on the reference hybrid decoders.

Per batch size: prefill a random prompt, run ``steps`` greedy decode steps with each SSM implementation, twice, in the
order A B B A (a captured CUDA graph per run on CUDA, wall clock on CPU), take the median step latency of both runs, the SSM share of a step (the SSM ops
alone, timed the same way, over the step), check that greedy tokens agree (asserted for fp32 state) and report the
largest logit difference. Results: ``decode_step`` records in a JSON file and a speed-up plot.

With ``spec_tokens`` = T (speculative decoding: the verify and commit ops, CUDA kernels on a GPU) each batch also
runs ``steps`` verify steps of T tokens per row (the last sampled token and T - 1
random drafts) with the per-draft-state SSM path and with the replay verify, both on the same synthetic, seeded
acceptance pattern of mean ``mean_accept``; their records report accepted tokens per second.
"""
from __future__ import annotations

import datetime as _dt
import gc
import importlib.util
import json
import platform
import shutil
import statistics
import subprocess
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

import torch

from trtllm_replayssm.lab.models import (DecodeRun, HybridConfig, HybridLM, acceptance_pattern, from_preset,
                                         greedy_decode, load_hf_config, speculative_decode, time_ssm_only)
from trtllm_replayssm.lab.models.weights import from_pretrained
from trtllm_replayssm.lab.plotting import PlotUnavailable, pyplot, save_figure

STATE_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
ACT_DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


CPU_FALLBACK_NOTE = ("CPU run: these timings measure the PyTorch fallback ops (the CPU reference), not the CUDA "
                     "kernels; they say nothing about GPU speed")
SPEC_NOTE = ("speculative records: replay_verify runs the verify and commit ops (checkpoint + ring), "
             "per_draft_verify the baseline state update once per window token on draft copies of the state")
MAX_SPEC_TOKENS = 8
# speculative implementations and the SSM state each runs on: per-draft states (baseline) or checkpoint + ring
SPEC_SSM_IMPLS: dict[str, str] = {"per_draft_verify": "baseline", "replay_verify": "replay"}


class TokenMismatchError(RuntimeError):
    """Greedy tokens of the baseline and replay decoders (or per-draft and replay verify) differ for fp32 state."""


@dataclass(frozen=True)
class ProgressEvent:
    """Where a compare run is: ``model``, ``batch`` (the ``batch_index``-th of ``batches``), ``impl`` in the
    ``impl_index``-th of the batch's ``impls`` runs (measure_batch) and its ``phase`` (``load``, ``decode`` with ``done`` of ``steps`` steps,
    ``ssm timing``, ``batch done``)."""

    model: str
    phase: str
    batch: int = 0
    batch_index: int = 0
    batches: int = 0
    impl: str = ""
    done: int = 0
    steps: int = 0
    impl_index: int = 0
    impls: int = 4


ProgressCallback = Callable[[ProgressEvent], None]


@dataclass
class CompareSettings:
    """What one ``compare`` run measures."""

    batches: tuple[int, ...] = (1, 8, 64, 256, 512)
    steps: int = 64
    state_dtype: str = "fp32"
    act_dtype: str | None = None  # default: bf16 on CUDA, fp32 on CPU
    buffer_len: int = 16
    prompt_len: int = 16
    gpu_layers: int | None = None
    device: str | None = None  # default: cuda if available
    seed: int = 0
    keep_rows: int = 4
    replay_mode: str = "auto"
    spec_tokens: int | None = None  # speculative windows of T tokens (None: standard decode only)
    mean_accept: float | None = None  # the synthetic acceptance pattern's mean accepted count per window

    def __post_init__(self) -> None:
        if not self.batches or any(not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"batch: expected positive ints, got {self.batches}")
        if self.state_dtype not in STATE_DTYPES:
            raise ValueError(f"state_dtype: expected one of {list(STATE_DTYPES)}, got {self.state_dtype!r}")
        if self.act_dtype is not None and self.act_dtype not in ACT_DTYPES:
            raise ValueError(f"act_dtype: expected one of {list(ACT_DTYPES)}, got {self.act_dtype!r}")
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len: expected >= 1, got {self.prompt_len}")
        if self.state_dtype == "fp32" and self.steps < 3 * self.buffer_len:
            raise ValueError(f"steps: the fp32 token check needs >= 3 flush cycles, i.e. steps >= 3 * buffer_len = "
                             f"{3 * self.buffer_len}, got {self.steps}")
        if self.steps < 1:
            raise ValueError(f"steps: expected >= 1, got {self.steps}")
        if self.spec_tokens is None:
            if self.mean_accept is not None:
                raise ValueError("mean_accept: only for a speculative run (give its window length T too)")
        else:
            self._check_spec()

    def _check_spec(self) -> None:
        T = self.spec_tokens
        if isinstance(T, bool) or not isinstance(T, int) or not 2 <= T <= MAX_SPEC_TOKENS:
            raise ValueError(f"spec_tokens: expected a window of 2 to {MAX_SPEC_TOKENS} tokens (the last sampled one "
                             f"and 1 to {MAX_SPEC_TOKENS - 1} drafts), got {T!r}")
        if T > self.buffer_len:
            raise ValueError(f"spec_tokens: a window of {T} tokens must fit the ring: expected T <= buffer_len = "
                             f"{self.buffer_len}")
        if self.mean_accept is None:
            raise ValueError(f"mean_accept: required for a speculative run (the mean accepted tokens per window, "
                             f"1 to T = {T})")
        if not 1 <= self.mean_accept <= T:
            raise ValueError(f"mean_accept: expected 1 <= A <= T = {T} (the bonus token counted), got "
                             f"{self.mean_accept}")

    @property
    def torch_device(self) -> torch.device:
        return torch.device(self.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    @property
    def torch_act_dtype(self) -> torch.dtype:
        if self.act_dtype is not None:
            return ACT_DTYPES[self.act_dtype]
        return torch.bfloat16 if self.torch_device.type == "cuda" else torch.float32


@dataclass
class ModelResult:
    """Records and checks of one model."""

    model: str
    layers: str
    notes: list[str]
    records: list[dict[str, Any]] = field(default_factory=list)
    checks: list[dict[str, Any]] = field(default_factory=list)


def check_models(models: list[str]) -> None:
    """ValueError (naming ``model``) unless every model is a safetensors directory, a config.json / model directory
    or a preset with a reference decoder; reads configs only."""
    if not models:
        raise ValueError("model: expected at least one model")
    for model in models:
        path = Path(model)
        if not (path.is_dir() and any(path.glob("*.safetensors"))):
            load_hf_config(path) if path.exists() else from_preset(model)


def load_model(model: str, settings: CompareSettings) -> tuple[HybridLM, list[str]]:
    """A decoder for ``model``: a preset name or a config.json (random weights), or a model directory with
    ``*.safetensors`` (real weights). Returns the model and notes on what it is."""
    path = Path(model)
    dev, act = settings.torch_device, settings.torch_act_dtype
    if path.is_dir() and any(path.glob("*.safetensors")):
        m = from_pretrained(path, dtype=act, device=dev, gpu_layers=settings.gpu_layers)
        return m, [f"real weights from {path}"] + m.cfg.describe()
    cfg: HybridConfig = load_hf_config(path) if path.exists() else from_preset(model)
    if settings.gpu_layers is not None:
        cfg = cfg.slice(settings.gpu_layers)
    m = HybridLM.build(cfg, dtype=act, device=dev, seed=settings.seed)
    return m, ["random weights"] + cfg.describe()


def _free() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def compare_impls(settings: CompareSettings) -> tuple[str, ...]:
    """What a run measures per batch: standard decode with the baseline and the replay SSM op, and with
    ``spec_tokens`` the per-draft-state and the replay speculative verify (:data:`SPEC_SSM_IMPLS`)."""
    return ("baseline", "replay") + (tuple(SPEC_SSM_IMPLS) if settings.spec_tokens else ())


@dataclass(frozen=True)
class SpecWindows:
    """The speculative windows every implementation of a batch verifies: ``drafts [steps, b, T - 1]`` and the
    synthetic accepted counts ``accepted [steps, b]``."""

    drafts: torch.Tensor
    accepted: torch.Tensor

    @classmethod
    def draw(cls, settings: CompareSettings, vocab: int, batch: int, gen: torch.Generator) -> "SpecWindows":
        """Random draft tokens from ``gen`` and the acceptance pattern of ``settings`` (seeded by seed + batch)."""
        T = settings.spec_tokens
        drafts = torch.randint(0, vocab, (settings.steps, batch, T - 1), generator=gen)
        return cls(drafts, acceptance_pattern(T, settings.mean_accept, settings.steps, batch, settings.seed + batch))

    @property
    def mean_accept(self) -> float:
        return float(self.accepted.double().mean())


def _decode(model: HybridLM, impl: str, prompt: torch.Tensor, settings: CompareSettings, spec: SpecWindows | None,
            on_step: Callable[[int, int], None] | None) -> tuple[DecodeRun, Callable[[int], list[float]]]:
    """Run ``impl`` on ``prompt``: greedy decode steps or, for a speculative impl, verify steps of ``spec``. Returns
    the run and ``reps -> µs per call`` of its SSM ops alone on the state it left."""
    batch = prompt.shape[0]
    common = dict(state_dtype=STATE_DTYPES[settings.state_dtype], buffer_len=settings.buffer_len,
                  replay_mode=settings.replay_mode)
    if impl not in SPEC_SSM_IMPLS:
        state = model.allocate(batch, settings.prompt_len + settings.steps + 1, ssm_impl=impl, **common)
        run = greedy_decode(model, state, prompt, settings.steps, keep_rows=settings.keep_rows, on_step=on_step)
        return run, lambda reps: time_ssm_only(model, state, reps)
    T = settings.spec_tokens
    state = model.allocate(batch, settings.prompt_len + settings.steps * T + 1, ssm_impl=SPEC_SSM_IMPLS[impl],
                           spec_tokens=T, **common)
    run = speculative_decode(model, state, prompt, spec.drafts, spec.accepted, keep_rows=settings.keep_rows,
                             on_step=on_step)
    return run, lambda reps: time_ssm_only(model, state, reps, accepted=spec.accepted[0])


def _record(model: HybridLM, impl: str, settings: CompareSettings, run: DecodeRun, ssm_us: float,
            spec: SpecWindows | None) -> dict[str, Any]:
    """The ``decode_step`` record of one run: step latency, SSM share, tokens per second (for a speculative impl the
    accepted ones: batch x mean accepted count per verify step)."""
    batch, step_us = run.tokens.shape[1], run.median_step_us
    speculative = impl in SPEC_SSM_IMPLS
    mean_accept = spec.mean_accept if speculative else 1.0
    accepted_per_s = batch * mean_accept / (step_us * 1e-6)
    return {
        "kind": "decode_step", "model": model.cfg.name, "layers": model.cfg.layers_label, "impl": impl,
        "batch": batch, "state_dtype": settings.state_dtype, "act_dtype": str(model.dtype).replace("torch.", ""),
        "L": settings.buffer_len, "steps": settings.steps, "median_step_us": step_us,
        "ssm_median_us": ssm_us, "ssm_share": ssm_us / step_us, "tokens_per_s": accepted_per_s,
        "cuda_graph": run.graphed, "spec_tokens": settings.spec_tokens if speculative else 1,
        "mean_accept": mean_accept, "accepted_tokens_per_s": accepted_per_s,
    }


def mirrored(impls: tuple[str, ...]) -> tuple[str, ...]:
    """The order a batch runs its implementations in: each twice, the second time in reverse (A B B A), so that a
    drift over the batch's runs (clocks, allocator state) weighs on every implementation alike."""
    return impls + impls[::-1]


def measure_batch(model: HybridLM, batch: int, settings: CompareSettings,
                  progress: Callable[[int, str, str, int], None] | None = None) -> tuple[list[dict], list[dict]]:
    """Decode ``batch`` sequences with every implementation of :func:`compare_impls`, each twice in the order of
    :func:`mirrored`; returns (one decode_step record each, its step and SSM-only times pooled over both runs; token
    checks of the first runs: baseline vs replay decode and, speculative, per-draft vs replay verify).
    ``progress(run, impl, phase, steps_done)`` reports each step and the SSM-only timing of the ``run``-th run."""
    gen = torch.Generator().manual_seed(settings.seed + batch)
    prompt = torch.randint(0, model.cfg.vocab_size, (batch, settings.prompt_len), generator=gen)
    spec = SpecWindows.draw(settings, model.cfg.vocab_size, batch, gen) if settings.spec_tokens else None
    impls = compare_impls(settings)
    runs: dict[str, DecodeRun] = {}
    ssm_times: dict[str, list[float]] = {impl: [] for impl in impls}
    for k, impl in enumerate(mirrored(impls)):
        on_step = (lambda done, _steps, k=k, impl=impl: progress(k, impl, "decode", done)) if progress else None
        run, time_ssm = _decode(model, impl, prompt, settings, spec, on_step)
        if progress:
            progress(k, impl, "ssm timing", settings.steps)
        ssm_times[impl] += time_ssm(max(settings.steps // 2, 5))
        # the first run's tokens and logits; the step times of both
        runs[impl] = replace(runs[impl], step_us=runs[impl].step_us + run.step_us) if impl in runs else run
        del time_ssm  # and with it the decode state
        _free()
    records = [_record(model, impl, settings, runs[impl], statistics.median(ssm_times[impl]), spec)
               for impl in impls]
    pairs = [("baseline", "replay", 1)]
    if spec:
        pairs.append(("per_draft_verify", "replay_verify", settings.spec_tokens))
    checks = [dict(token_check(runs[a], runs[b], settings), model=model.cfg.name, batch=batch, spec_tokens=t)
              for a, b, t in pairs]
    return records, checks


def tie_tolerance(act_dtype: torch.dtype, top_logit: float) -> float:
    """Top-2 logit gap below which a greedy divergence is a rounding near-tie rather than an error: two units in the
    last place of the top logit in the activation dtype (the logits are rounded to it), at least 1e-4."""
    return max(1e-4, 2.0 * torch.finfo(act_dtype).eps * abs(top_logit))


def token_check(base: DecodeRun, rep: DecodeRun, settings: CompareSettings) -> dict[str, Any]:
    """Compare greedy tokens row by row. A row whose first divergence happens where the baseline's top-2 logit gap is
    within :func:`tie_tolerance` is a near-tie (reported); any other divergence is a mismatch (fp32 state: fails).
    ``max_abs_dlogits`` covers the kept rows up to their first divergence (inputs identical until then)."""
    act = settings.torch_act_dtype
    diff = base.tokens != rep.tokens  # [steps+1, b]; row 0 comes from the shared prefill
    near_ties, mismatches = [], []
    first = {}
    for row in diff.any(0).nonzero().flatten().tolist():
        step = int(diff[:, row].nonzero()[0])
        first[row] = step
        gap = float(base.gaps[step - 1, row]) if step >= 1 else float("inf")
        tol = tie_tolerance(act, float(base.top[step - 1, row])) if step >= 1 else 0.0
        entry = {"row": row, "step": step, "baseline": int(base.tokens[step, row]),
                 "replay": int(rep.tokens[step, row]), "baseline_top2_gap": gap, "tolerance": tol}
        (near_ties if gap <= tol else mismatches).append(entry)
    dlog = 0.0
    for r in range(base.logits.shape[1]):
        n = first.get(r, base.logits.shape[0] + 1)  # logits of steps < n had identical inputs
        if n:
            dlog = max(dlog, (base.logits[:n, r] - rep.logits[:n, r]).abs().max().item())
    return {"kind": "token_check", "state_dtype": settings.state_dtype,
            "act_dtype": str(settings.torch_act_dtype).replace("torch.", ""), "L": settings.buffer_len,
            "steps": settings.steps, "flush_cycles": settings.steps // settings.buffer_len,
            "tokens_equal": not diff.any().item(), "rows": base.tokens.shape[1],
            "near_tie_rows": len(near_ties), "mismatch_rows": len(mismatches), "mismatches": mismatches[:5],
            "near_ties": near_ties[:5], "max_abs_dlogits": dlog, "logit_rows": base.logits.shape[1]}


def run_model(model: str, settings: CompareSettings, progress: ProgressCallback | None = None,
              on_batch: Callable[[ModelResult], None] | None = None) -> ModelResult:
    """Load ``model`` and measure every batch size of ``settings``; ``on_batch(result so far)`` after each batch."""
    if progress:
        progress(ProgressEvent(model, "load"))
    m, notes = load_model(model, settings)
    result = ModelResult(m.cfg.name, m.cfg.layers_label, notes)
    n, runs = len(settings.batches), len(mirrored(compare_impls(settings)))
    for i, batch in enumerate(settings.batches):
        def step(run: int, impl: str, phase: str, done: int, batch: int = batch, i: int = i) -> None:
            if progress:
                progress(ProgressEvent(result.model, phase, batch, i, n, impl, done, settings.steps, run, runs))

        recs, checks = measure_batch(m, batch, settings, step if progress else None)
        result.records += recs
        result.checks += checks
        if progress:
            progress(ProgressEvent(result.model, "batch done", batch, i, n, "", settings.steps, settings.steps,
                                   runs - 1, runs))
        if on_batch:
            on_batch(result)
    del m
    _free()
    return result


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)"


def _by_batch(records: list[dict[str, Any]]) -> dict[tuple, dict[str, dict]]:
    """``decode_step`` records by (model, layers, batch), then by impl."""
    by_key: dict[tuple, dict[str, dict]] = {}
    for r in records:
        if r.get("kind") == "decode_step":
            by_key.setdefault((r["model"], r["layers"], r["batch"]), {})[r["impl"]] = r
    return by_key


def speedups(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, layers, batch): baseline and replay step times, speed-up, tokens/s and SSM shares."""
    rows = []
    for (model, layers, batch), impls in _by_batch(records).items():
        if {"baseline", "replay"} <= impls.keys():
            b, p = impls["baseline"], impls["replay"]
            rows.append({"model": model, "layers": layers, "batch": batch, "baseline_us": b["median_step_us"],
                         "replay_us": p["median_step_us"], "speedup": b["median_step_us"] / p["median_step_us"],
                         "baseline_tok_s": b["tokens_per_s"], "replay_tok_s": p["tokens_per_s"],
                         "baseline_ssm_share": b["ssm_share"], "replay_ssm_share": p["ssm_share"]})
    return rows


def spec_speedups(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (model, layers, batch) of a speculative run: verify step times and accepted tokens/s of the per-draft
    and the replay verify, standard replay decode's tokens/s, and the replay verify's ratios to both."""
    rows = []
    for (model, layers, batch), impls in _by_batch(records).items():
        if {"replay", *SPEC_SSM_IMPLS} <= impls.keys():
            d, v, r = impls["per_draft_verify"], impls["replay_verify"], impls["replay"]
            rows.append({"model": model, "layers": layers, "batch": batch, "spec_tokens": v["spec_tokens"],
                         "mean_accept": v["mean_accept"], "per_draft_us": d["median_step_us"],
                         "verify_us": v["median_step_us"], "per_draft_tok_s": d["accepted_tokens_per_s"],
                         "verify_tok_s": v["accepted_tokens_per_s"], "decode_tok_s": r["accepted_tokens_per_s"],
                         "vs_per_draft": v["accepted_tokens_per_s"] / d["accepted_tokens_per_s"],
                         "vs_decode": v["accepted_tokens_per_s"] / r["accepted_tokens_per_s"]})
    return rows


def plot_speedup(records: list[dict[str, Any]], path: str | Path, title: str = "") -> Path:
    """PNG: decode-step speed-up (baseline / replay) vs batch size, one line per model."""
    plt = pyplot()

    rows = speedups(records)
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label in sorted({(r["model"], r["layers"]) for r in rows}):
        pts = sorted((r["batch"], r["speedup"]) for r in rows if (r["model"], r["layers"]) == label)
        name = label[0] if label[1] == "all" else f"{label[0]} (layers {label[1]})"
        ax.plot([b for b, _ in pts], [s for _, s in pts], marker="o", label=name)
    ax.axhline(1.0, color="grey", lw=0.8, ls="--")
    ax.set_xscale("log", base=2)
    batches = sorted({r["batch"] for r in rows})
    ax.set_xticks(batches, [str(b) for b in batches])
    ax.minorticks_off()
    ax.set_xlabel("batch size")
    ax.set_ylabel("decode-step speed-up (baseline / replay)")
    ax.set_title(title or "ReplaySSM vs baseline, whole decode step")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def build_report(results: list[ModelResult], settings: CompareSettings, complete: bool = True) -> dict[str, Any]:
    """The JSON document: ``device``, ``date``, ``engine``, ``timing_note`` (CPU runs), ``spec_note`` (speculative
    runs), ``complete`` (False while a run is under way or after it was stopped), ``settings``, ``records``
    (decode_step), ``checks``, ``notes``."""
    cpu = settings.torch_device.type == "cpu"
    engine = "reference decoder (TensorRT-LLM not used)"
    return {
        "device": device_name(settings.torch_device),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "engine": engine + (", PyTorch CPU fallback ops" if cpu else ", CUDA kernels"),
        "timing_note": CPU_FALLBACK_NOTE if cpu else None,
        "spec_note": SPEC_NOTE if settings.spec_tokens else None,
        "complete": complete,
        "settings": {"batches": list(settings.batches), "steps": settings.steps, "state_dtype": settings.state_dtype,
                     "act_dtype": str(settings.torch_act_dtype).replace("torch.", ""), "L": settings.buffer_len,
                     "prompt_len": settings.prompt_len, "gpu_layers": settings.gpu_layers,
                     "replay_mode": settings.replay_mode, "seed": settings.seed, "spec_tokens": settings.spec_tokens,
                     "mean_accept": settings.mean_accept},
        "notes": {r.model: r.notes for r in results},
        "records": [rec for r in results for rec in r.records],
        "checks": [c for r in results for c in r.checks],
    }


def check_tokens(report: dict[str, Any]) -> None:
    """Raise :class:`TokenMismatchError` if any fp32-state check found greedy tokens that differ other than at a
    rounding near-tie."""
    bad = [c for c in report["checks"] if c["state_dtype"] == "fp32" and c["mismatch_rows"]]
    if bad:
        raise TokenMismatchError("greedy tokens differ between baseline and replay for fp32 state (not at a "
                                 "near-tie): " + "; ".join(f"{_check_label(c)}: {c['mismatch_rows']} rows, first "
                                                          f"{c['mismatches'][0]}" for c in bad))


def _check_label(check: dict[str, Any]) -> str:
    """``model batch b`` and, for a speculative check (per-draft vs replay verify), ``verify T = t``."""
    label = f"{check['model']} batch {check['batch']}"
    return label if check.get("spec_tokens", 1) == 1 else f"{label} verify T = {check['spec_tokens']}"


def run_compare(models: list[str], settings: CompareSettings, out_dir: str | Path,
                progress: ProgressCallback | None = None) -> dict[str, Any]:
    """Run every model, write ``compare.json`` (after every batch, so a stopped run keeps what it measured) and
    ``compare_speedup.png`` (when matplotlib is installed) into ``out_dir``; return the report.
    Raises :class:`TokenMismatchError` (after writing) if fp32 greedy tokens differ."""
    check_models(models)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / "compare.json"
    done: list[ModelResult] = []

    def save(current: ModelResult | None = None, complete: bool = False) -> dict[str, Any]:
        report = build_report(done + ([current] if current else []), settings, complete)
        json_path.write_text(json.dumps(report, indent=2) + "\n")
        return report

    for model in models:
        done.append(run_model(model, settings, progress, on_batch=save))
    report = save(complete=True)
    files = [str(json_path)]
    try:
        png = plot_speedup(report["records"], out / "compare_speedup.png",
                           title=f"ReplaySSM decode step, {report['device']}, {settings.state_dtype} state, "
                                 f"L={settings.buffer_len}")
        files.append(str(png))
    except PlotUnavailable as exc:
        report["plot_note"] = str(exc)
    report["files"] = files
    check_tokens(report)
    return report


# ---------------------------------------------------------------------- TensorRT-LLM (trtllm-bench)
def trtllm_available() -> bool:
    """True when the ``tensorrt_llm`` package and the ``trtllm-bench`` executable are both present."""
    return importlib.util.find_spec("tensorrt_llm") is not None and shutil.which("trtllm-bench") is not None


def trtllm_bench_commands(model: str, bundle: str | Path, batches: tuple[int, ...], out_dir: str | Path,
                          num_requests: int = 512, isl: int = 1024,
                          osl: int = 1024) -> list[tuple[str, int, list[str]]]:
    """Command lines: one generated dataset (``trtllm-bench prepare-dataset``), then ``throughput`` per batch for
    the baseline (the bundle's YAML, no custom module) and for the bundle (``--custom_module_dirs``). Only
    ``throughput`` takes ``--custom_module_dirs`` (``latency`` does not), so batch 1 is a throughput run at
    concurrency 1; the YAML goes through ``--extra_llm_api_options`` (``--config`` is its alias only in newer
    releases). Returns ``(impl, batch, argv)``; batch 0 marks the dataset step."""
    bundle, out = Path(bundle), Path(out_dir)
    yaml_path, module_dir = bundle / "trtllm-serve.yaml", bundle / "trtllm_module"
    for need in (yaml_path, module_dir):
        if not need.exists():
            raise ValueError(f"bundle: expected {need.name} in {str(bundle)!r} (from `trtllm-replayssm build`)")
    data = out / "trtllm_dataset.jsonl"
    cmds: list[tuple[str, int, list[str]]] = [("dataset", 0, prepare_dataset_argv(model, data, num_requests, isl, osl))]
    for impl, extra in (("baseline", []), ("replay", ["--custom_module_dirs", str(module_dir)])):
        for b in batches:
            cmds.append((impl, b, [
                "trtllm-bench", "-m", model, "throughput", "--dataset", str(data), "--backend", "pytorch",
                "--extra_llm_api_options", str(yaml_path), "--max_batch_size", str(b), "--concurrency", str(b),
                "--num_requests", str(num_requests), "--warmup", "8", "--streaming",
                "--report_json", str(out / f"trtllm_{impl}_b{b}.json"), *extra]))
    return cmds


def prepare_dataset_argv(model: str, output: str | Path, num_requests: int, isl: int, osl: int) -> list[str]:
    """``trtllm-bench prepare-dataset`` for ``num_requests`` synthetic requests of exactly ``isl`` input and ``osl``
    output tokens (the tokenizer comes from ``-m``)."""
    return ["trtllm-bench", "-m", model, "prepare-dataset", "--output", str(output), "token-norm-dist",
            "--num-requests", str(num_requests), "--input-mean", str(isl), "--input-stdev", "0",
            "--output-mean", str(osl), "--output-stdev", "0"]


def bench_metrics(report: Any, prefix: str = "") -> dict[str, float]:
    """Numeric leaves of a ``trtllm-bench --report_json`` document whose key names a latency or throughput metric
    (contains ``tpot``, ``itl``, ``throughput``, ``tps`` or ``latency``), flattened to dotted keys as reported."""
    out: dict[str, float] = {}
    if isinstance(report, dict):
        for key, value in report.items():
            name = f"{prefix}.{key}" if prefix else str(key)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                if any(tag in str(key).lower() for tag in ("tpot", "itl", "throughput", "tps", "latency")):
                    out[name] = float(value)
            else:
                out.update(bench_metrics(value, name))
    return out


def run_trtllm_bench(model: str, bundle: str | Path, batches: tuple[int, ...], out_dir: str | Path) -> dict[str, Any]:
    """Run the :func:`trtllm_bench_commands` and collect the raw reports as ``trtllm_bench`` records."""
    if not trtllm_available():
        raise RuntimeError("trtllm-bench: TensorRT-LLM is not installed here")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    records = []
    for impl, batch, argv in trtllm_bench_commands(model, bundle, batches, out):
        subprocess.run(argv, check=True)
        if impl == "dataset":
            continue
        report_path = Path(argv[argv.index("--report_json") + 1])
        records.append({"kind": "trtllm_bench", "model": model, "impl": impl, "batch": batch,
                        "mode": argv[3], "report": json.loads(report_path.read_text())})
        records[-1]["metrics"] = bench_metrics(records[-1]["report"])
    return {"device": device_name(torch.device("cuda")),
            "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
            "engine": "trtllm-bench", "records": records}
