"""Scale granularity of the quantized state formats (development only): NVFP4's fp32 second-level scale per state row,
per (slot, head) or per layer, and FP8 with one fp32 scale per row against one per 32- or 16-element block.

States come from the float64 ``sequential_step`` recurrences (Mamba-2 Nemotron-3-Nano-4B-like head_dim 80 and
Super-like head_dim 64, d_state 128; GDN Qwen3.5-4B-like and KDA Kimi-Linear-like K = V = 128), run from a zero state
over a batch of independent sequences (slots) whose inputs have log-normal per-slot, per-head and per-channel scales.
At each snapshot the state is quantized and dequantized with ``core/quant.py``'s codecs, and the script reports, per
(slot, head), the relative Frobenius error of the state and of the read-outs the kernels take from it: Mamba-2
``S·C`` with a next token's C, GDN/KDA ``S·q~`` and ``S·k`` with a next token's normalised q (times K^-1/2) and k.
The per-(slot, head) and per-layer second-level scales are the exact amax of the state at the snapshot (the per-layer
one over the whole pool): the best case of each. ``slot_head_x100`` / ``_x1000`` overestimate the per-(slot, head)
amax 100 / 1000 times, as a scale taken from an upper bound or from a previous flush with headroom would.

Run (CPU, 2.5-5 minutes on 2 cores): PYTHONPATH=. python3 benchmarks/dev/quant_granularity.py
Writes benchmarks/results/quant-granularity-cpu.json (``--out``) and prints a table of the last snapshot.
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import time
from pathlib import Path

import torch

from trtllm_replayssm.core import quant
from trtllm_replayssm.core.reference import gdn, kda, mamba2

F64 = torch.float64

# Per-model geometry of the simulated layer: a handful of the model's heads with its per-head state shape.
MODELS = {
    "nemotron-3-nano-4b": {"family": "mamba2", "heads": 8, "key_heads": 2, "rows": 80, "cols": 128},
    "nemotron-3-super": {"family": "mamba2", "heads": 8, "key_heads": 2, "rows": 64, "cols": 128},
    "qwen3.5-4b": {"family": "gdn", "heads": 8, "key_heads": 4, "rows": 128, "cols": 128},
    "kimi-linear-48b": {"family": "kda", "heads": 8, "key_heads": 8, "rows": 128, "cols": 128},
}

# (format, granularity): NVFP4 second-level scale per row / per (slot, head) / per layer; "slot_head_xF": the per-(slot,
# head) amax overestimated F times, as a scale taken from an upper bound or a stale value with headroom would be; FP8
# fp32 scale per row or per block of 32 / 16 elements along the row; bf16 rounding as a reference point.
VARIANTS = (
    ("nvfp4", "row"), ("nvfp4", "slot_head"), ("nvfp4", "layer"), ("nvfp4", "slot_head_x100"),
    ("nvfp4", "slot_head_x1000"),
    ("fp8", "row"), ("fp8", "block32"), ("fp8", "block16"),
    ("bf16", "none"),
)
NVFP4_REDUCE = {"row": (-1,), "slot_head": (-2, -1), "layer": (0, 1, 2, 3)}
E4M3_MIN_NORMAL = 2.0**-6
METRICS = {
    "state_rel_fro": "||Sq - S||_F / ||S||_F per (slot, head)",
    "state_row_rel": "||Sq - S|| / ||S|| per (slot, head, row)",
    "readout_rel_S.C": "Mamba-2 ||(Sq - S) C|| / ||S C|| per (slot, head) and query, C drawn like a next token's",
    "readout_rel_S.q": "GDN/KDA ||(Sq - S) q~|| / ||S q~|| per (slot, value head) and query, q~ = K^-1/2 l2norm(q)",
    "readout_rel_S.k": "GDN/KDA ||(Sq - S) k|| / ||S k|| per (slot, value head) and query, k = l2norm(k)",
    "block_scale_subnormal_frac": "NVFP4: fraction of non-zero blocks whose E4M3 block scale is subnormal (< 2^-6)",
    "block_scale_zero_frac": "NVFP4: fraction of non-zero blocks whose E4M3 block scale rounds to 0 (block lost)",
    "state_rel_excl_block16_max": "FP8: relative error of the pool over the elements other than each 16-element "
                                  "block's largest",
    "block16_max_energy_share": "FP8: share of the pool's squared norm held by each 16-element block's largest element",
}


def log_uniform(shape: tuple[int, ...], lo: float, hi: float, gen: torch.Generator) -> torch.Tensor:
    return torch.exp(torch.empty(shape, dtype=F64).uniform_(math.log(lo), math.log(hi), generator=gen))


def log_normal(shape: tuple[int, ...], sigma: float, gen: torch.Generator) -> torch.Tensor:
    return torch.exp(sigma * torch.randn(shape, dtype=F64, generator=gen))


def inv_softplus(y: torch.Tensor) -> torch.Tensor:
    return torch.log(torch.expm1(y))


# ------------------------------------------------------------------------------------------------------ input streams
class Mamba2Stream:
    """Mamba-2 inputs: A = -exp(U(log 1, log 16)) per head; Δ = softplus(dt + dt_bias) with dt_bias the inverse
    softplus of a log-uniform [1e-3, 1e-1] per head and dt ~ N(0, 0.5²) per token; x, B, C ~ N(0, 1) times log-normal
    per-channel scales (x also per head and per slot), B and C over sqrt(N)."""

    def __init__(self, geo: dict, slots: int, args: argparse.Namespace, gen: torch.Generator, device: torch.device):
        H, G, P, N = geo["heads"], geo["key_heads"], geo["rows"], geo["cols"]
        self.shape, self.device = (slots, H, P, N), device
        self.A = -torch.exp(torch.empty(H, dtype=F64).uniform_(0.0, math.log(16.0), generator=gen))
        self.dt_bias = inv_softplus(log_uniform((H,), 1e-3, 1e-1, gen))
        self.x_scale = (log_normal((1, H, P), args.channel_sigma, gen) * log_normal((1, H, 1), args.head_sigma, gen)
                        * log_normal((slots, 1, 1), args.slot_sigma, gen))
        self.B_scale = log_normal((1, G, N), args.channel_sigma, gen) / math.sqrt(N)
        self.C_scale = log_normal((1, G, N), args.channel_sigma, gen) / math.sqrt(N)
        self.A, self.dt_bias = self.A.to(device), self.dt_bias.to(device)

    def token(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        S, H, P, N = self.shape
        G = self.B_scale.shape[1]
        t = {"x": torch.randn(S, H, P, dtype=F64, generator=gen) * self.x_scale,
             "dt": 0.5 * torch.randn(S, H, dtype=F64, generator=gen),
             "B": torch.randn(S, G, N, dtype=F64, generator=gen) * self.B_scale,
             "C": torch.randn(S, G, N, dtype=F64, generator=gen) * self.C_scale}
        return {k: v.to(self.device) for k, v in t.items()}

    def step(self, state: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
        new, _ = mamba2.sequential_step(state, t["x"], t["dt"], self.A, t["B"], t["C"], dt_bias=self.dt_bias)
        return new

    def queries(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The read-out vectors per (slot, head): ``S·C`` with the token's C of the head's group."""
        return {"S.C": t["C"].repeat_interleave(self.shape[1] // t["C"].shape[1], dim=1)}


class DeltaStream:
    """GDN / KDA inputs: q, k, v ~ N(0, 1) times log-normal per-channel scales (v also per head and per slot), q and
    k l2-normalised by the recurrence; log-gate ``-softplus(a + dt_bias)`` (A_log = 0) with dt_bias the inverse
    softplus of a rate log-uniform in [1e-4, 0.105] (α = e^g in 0.9 .. 0.9999) per head (GDN) or per (head, channel)
    (KDA), a ~ N(0, 0.3²) per token; beta = sigmoid(N(0, 1))."""

    def __init__(self, geo: dict, slots: int, args: argparse.Namespace, gen: torch.Generator, device: torch.device):
        H, HK, V, K = geo["heads"], geo["key_heads"], geo["rows"], geo["cols"]
        self.kda = geo["family"] == "kda"
        self.shape, self.key_heads, self.device = (slots, H, V, K), HK, device
        gate_shape = (H, K) if self.kda else (H,)
        self.dt_bias = inv_softplus(log_uniform(gate_shape, 1e-4, -math.log(0.9), gen)).to(device)
        self.A_log = torch.zeros(H, dtype=F64, device=device)
        self.q_scale = log_normal((1, HK, K), args.channel_sigma, gen)
        self.k_scale = log_normal((1, HK, K), args.channel_sigma, gen)
        self.v_scale = (log_normal((1, H, V), args.channel_sigma, gen) * log_normal((1, H, 1), args.head_sigma, gen)
                        * log_normal((slots, 1, 1), args.slot_sigma, gen))
        self.gate_shape = gate_shape

    def token(self, gen: torch.Generator) -> dict[str, torch.Tensor]:
        S, H, V, K = self.shape
        HK = self.key_heads
        t = {"q": torch.randn(S, HK, K, dtype=F64, generator=gen) * self.q_scale,
             "k": torch.randn(S, HK, K, dtype=F64, generator=gen) * self.k_scale,
             "v": torch.randn(S, H, V, dtype=F64, generator=gen) * self.v_scale,
             "a": 0.3 * torch.randn(S, *self.gate_shape, dtype=F64, generator=gen),
             "b": torch.randn(S, H, dtype=F64, generator=gen)}
        return {k: v.to(self.device) for k, v in t.items()}

    def step(self, state: torch.Tensor, t: dict[str, torch.Tensor]) -> torch.Tensor:
        ref = kda if self.kda else gdn
        _, new = ref.sequential_step(state, t["q"], t["k"], t["v"], t["a"], t["b"], self.A_log, self.dt_bias)
        return new

    def queries(self, t: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``S·q~`` (normalised q times K^-1/2) and ``S·k`` (normalised k), per value head."""
        H, K = self.shape[1], self.shape[3]
        expand = lambda x: x.repeat_interleave(H // self.key_heads, dim=1)  # noqa: E731
        return {"S.q": expand(gdn.l2_normalize(t["q"])) * K**-0.5, "S.k": expand(gdn.l2_normalize(t["k"]))}


# ------------------------------------------------------------------------------------------------------ codecs
def roundtrip(state: torch.Tensor, fmt: str, gran: str) -> tuple[torch.Tensor, dict[str, float]]:
    """The state after quantize + dequantize in ``fmt`` at ``gran`` (float64), and codec diagnostics."""
    x = state.float()
    if fmt == "bf16":
        return x.bfloat16().to(F64), {}
    if fmt == "fp8":
        blk = x if gran == "row" else x.unflatten(-1, (-1, int(gran.removeprefix("block"))))
        codes, scale = quant.quantize_fp8_rows(blk)
        out = quant.dequantize_fp8_rows(codes, scale)
        out = (out if gran == "row" else out.flatten(-2)).to(F64)
        mags = state.abs().unflatten(-1, (-1, 16))
        peak = (mags == mags.amax(-1, keepdim=True)).flatten(-2)  # the largest element(s) of each 16-element block
        sq, err_sq = state.square(), (out - state).square()
        diag = {"state_rel_excl_block16_max": float(((err_sq * ~peak).sum() / (sq * ~peak).sum()).sqrt()),
                "block16_max_energy_share": float((sq * peak).sum() / sq.sum())}
        return out, diag
    dims, _, factor = gran.partition("_x")
    g = quant.nvfp4_global_scale(x, NVFP4_REDUCE[dims]) * float(factor or 1)
    packed, bscale = quant.quantize_nvfp4(x, g)
    bs = bscale.float()
    live = x.unflatten(-1, (-1, quant.NVFP4_BLOCK)).abs().amax(-1) > 0
    diag = {"block_scale_subnormal_frac": float(((bs > 0) & (bs < E4M3_MIN_NORMAL) & live).sum() / live.sum()),
            "block_scale_zero_frac": float(((bs == 0) & live).sum() / live.sum())}
    return quant.dequantize_nvfp4(packed, bscale, g).to(F64), diag


def bytes_per_element(fmt: str, gran: str, rows: int, cols: int, pool_heads: int) -> float:
    """Stored bytes per state element: codes, block scales and second-level / row scales (``pool_heads``: slots ×
    heads of the layer's pool, over which a per-layer scale is shared)."""
    if fmt == "bf16":
        return 2.0
    if fmt == "fp8":
        return 1.0 + 4.0 / (cols if gran == "row" else int(gran.removeprefix("block")))
    per = {"row": cols, "slot_head": rows * cols, "layer": pool_heads * rows * cols}[gran.partition("_x")[0]]
    return 0.5 + 1.0 / quant.NVFP4_BLOCK + 4.0 / per


def rel_err(err: torch.Tensor, ref: torch.Tensor, dims: tuple[int, ...]) -> torch.Tensor:
    """Relative Frobenius error over ``dims`` (one value per remaining index), flattened, on the CPU."""
    num = err.square().sum(dims).sqrt()
    den = ref.square().sum(dims).sqrt()
    return (num / den.clamp_min(torch.finfo(F64).tiny)).flatten().cpu()


def stats(v: torch.Tensor) -> dict[str, float]:
    return {"median": float(v.median()), "p99": float(torch.quantile(v, 0.99)),
            "p99.9": float(torch.quantile(v, 0.999)), "max": float(v.max()), "mean": float(v.mean())}


def state_ranges(state: torch.Tensor) -> dict[str, float]:
    """log10 of max/min of the per-(slot, head) and per-row amax over the pool: how far magnitudes spread."""
    head = state.abs().amax(dim=(-2, -1)).flatten()
    row = state.abs().amax(dim=-1).flatten()
    return {"log10_head_amax_spread": float((head.max() / head.min()).log10()),
            "log10_row_amax_spread": float((row.max() / row.min()).log10()),
            "log10_row_amax_spread_within_head_max": float(
                (state.abs().amax(-1).amax(-1) / state.abs().amax(-1).amin(-1)).log10().max())}


def evaluate(name: str, geo: dict, stream, state: torch.Tensor, tokens: list[dict], step: int,
             base: dict) -> list[dict]:
    """Records of every variant at one snapshot; the read-outs use the query vectors of each token in ``tokens``."""
    slots, heads, rows, cols = state.shape
    common = {**base, "model": name, "family": geo["family"],
              "shape": {"slots": slots, "heads": heads, "rows": rows, "cols": cols}, "snapshot_step": step,
              "queries_per_snapshot": len(tokens)}
    queries = [stream.queries(t) for t in tokens]
    matvec = lambda s, q: (s @ q.unsqueeze(-1)).squeeze(-1)  # noqa: E731
    ref_out = [{k: matvec(state, q) for k, q in qs.items()} for qs in queries]
    records = []
    for fmt, gran in VARIANTS:
        deq, diag = roundtrip(state, fmt, gran)
        err = deq - state
        metrics = {"state_rel_fro": stats(rel_err(err, state, (-2, -1))),
                   "state_row_rel": stats(rel_err(err, state, (-1,)))}
        for k in queries[0]:
            errs = [rel_err(matvec(deq, qs[k]) - ref[k], ref[k], (-1,)) for qs, ref in zip(queries, ref_out)]
            metrics[f"readout_rel_{k}"] = stats(torch.cat(errs))
        info = {**common, "format": fmt, "granularity": gran,
                "bytes_per_element": bytes_per_element(fmt, gran, rows, cols, slots * heads)}
        records += [{**info, "metric": m, **v} for m, v in metrics.items()]
        records += [{**info, "metric": m, "value": v} for m, v in diag.items()]
    return records


def run_model(name: str, args: argparse.Namespace, seed: int, device: torch.device) -> tuple[list[dict], list[dict]]:
    geo = MODELS[name]
    gen = torch.Generator().manual_seed(seed)
    query_gen = torch.Generator().manual_seed(seed + 500)  # read-out vectors: drawn like a next token, off the stream
    cls = Mamba2Stream if geo["family"] == "mamba2" else DeltaStream
    stream = cls(geo, args.slots, args, gen, device)
    state = torch.zeros(stream.shape, dtype=F64, device=device)
    snapshots = sorted(set(args.snapshots))
    base = {"seed": seed, "steps": args.steps}
    records, ranges = [], []
    t0 = time.time()
    for i in range(args.steps + 1):
        if i in snapshots:  # the state after i tokens
            tokens = [stream.token(query_gen) for _ in range(args.queries)]
            records += evaluate(name, geo, stream, state, tokens, i, base)
            ranges.append({"model": name, "snapshot_step": i, **state_ranges(state)})
        if i < args.steps:
            state = stream.step(state, stream.token(gen))
    print(f"# {name}: {args.steps} tokens x {args.slots} slots in {time.time() - t0:.1f} s", file=sys.stderr,
          flush=True)
    return records, ranges


# ------------------------------------------------------------------------------------------------------ report
def print_table(records: list[dict], snapshots: list[int]) -> None:
    step = snapshots[-1]
    rec = {(r["model"], r["snapshot_step"], r["format"], r["granularity"], r["metric"]): r for r in records}
    print(f"relative error (%) after {step} tokens: state per (slot, head) median / p99; state per row p99 / p99.9 / "
          "max; read-outs per (slot, head) median / p99 (Mamba-2 S.C; GDN/KDA S.q, S.k)")
    hdr = (f"{'model':<19} {'format':<6} {'scale':<15} {'B/elem':>6}  {'state':>13}  {'state row':>21}  "
           f"{'read-out 1':>13}  {'read-out 2':>13}")
    print(hdr)
    print("-" * len(hdr))
    for name in MODELS:
        metrics = [m for m in ("state_rel_fro", "readout_rel_S.C", "readout_rel_S.q", "readout_rel_S.k")
                   if (name, step, "fp8", "row", m) in rec]
        if not metrics:
            continue
        for fmt, gran in VARIANTS:
            rs = [rec[(name, step, fmt, gran, m)] for m in metrics]
            cells = [f"{100 * r['median']:5.2f} / {100 * r['p99']:5.2f}" for r in rs] + [""] * (3 - len(rs))
            row = rec[(name, step, fmt, gran, "state_row_rel")]
            cells.insert(1, f"{100 * row['p99']:5.2f} / {100 * row['p99.9']:5.2f} / {100 * row['max']:5.1f}")
            print(f"{name:<19} {fmt:<6} {gran:<15} {rs[0]['bytes_per_element']:6.4f}  {cells[0]:>13}  {cells[1]:>21}  "
                  f"{cells[2]:>13}  {cells[3]:>13}")
    print(f"\np99 (%) of read-out 1 by snapshot ({', '.join(str(s) for s in snapshots)} tokens)")
    for name in MODELS:
        metric = "readout_rel_S.C" if (name, step, "fp8", "row", "readout_rel_S.C") in rec else "readout_rel_S.q"
        if (name, step, "fp8", "row", metric) not in rec:
            continue
        for fmt, gran in VARIANTS:
            vals = "  ".join(f"{100 * rec[(name, s, fmt, gran, metric)]['p99']:6.2f}" for s in snapshots)
            print(f"{name:<19} {fmt:<6} {gran:<15} {vals}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--slots", type=int, default=16, help="independent sequences per layer pool")
    p.add_argument("--steps", type=int, default=1024, help="tokens per sequence from a zero state")
    p.add_argument("--snapshots", type=int, nargs="+", default=[64, 256, 1024],
                   help="token counts at which the state is quantized (<= --steps)")
    p.add_argument("--slot-sigma", type=float, default=1.0, help="log-normal sigma of the per-slot input scale")
    p.add_argument("--head-sigma", type=float, default=0.5, help="log-normal sigma of the per-head input scale")
    p.add_argument("--channel-sigma", type=float, default=1.0, help="log-normal sigma of the per-channel scales")
    p.add_argument("--queries", type=int, default=8,
                   help="read-out query vectors per snapshot (each drawn like a next token)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (0: torch's default)")
    p.add_argument("--out", default="benchmarks/results/quant-granularity-cpu.json")
    args = p.parse_args()
    if any(s < 1 or s > args.steps for s in args.snapshots):
        p.error("--snapshots must lie in [1, --steps]")
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device)

    records, ranges = [], []
    for name in args.models:  # each model's seed depends on its name only, so a subset reproduces the full run
        r, g = run_model(name, args, args.seed * 1000 + list(MODELS).index(name), device)
        records += r
        ranges += g
    doc = {
        "description": "NVFP4 second-level scale granularity and FP8 row vs block scales on states of the float64 "
                       "recurrences; relative errors per (slot, head), median / p99 / max / mean over the pool",
        "command": "python3 benchmarks/dev/quant_granularity.py " + " ".join(sys.argv[1:]),
        "config": {**vars(args), "models": {m: MODELS[m] for m in args.models}},
        "metrics": METRICS,
        "environment": {"torch": torch.__version__, "python": platform.python_version(), "device": str(device)},
        "state_ranges": ranges,
        "records": records,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print_table(records, sorted(set(args.snapshots)))
    last = max(args.snapshots)
    print("\nmagnitude spread (log10 max/min amax) at the last snapshot:")
    for g in ranges:
        if g["snapshot_step"] == last:
            print(f"  {g['model']:<20} per (slot, head) {g['log10_head_amax_spread']:.2f}, per row "
                  f"{g['log10_row_amax_spread']:.2f}, rows within one head up to "
                  f"{g['log10_row_amax_spread_within_head_max']:.2f}")
    sub = [r for r in records if r["metric"] == "block_scale_subnormal_frac" and r["snapshot_step"] == last]
    zero = {(r["model"], r["granularity"]): r["value"] for r in records
            if r["metric"] == "block_scale_zero_frac" and r["snapshot_step"] == last}
    print("NVFP4 blocks (non-zero) with a subnormal / zero E4M3 block scale at the last snapshot:")
    for r in sub:
        print(f"  {r['model']:<20} {r['granularity']:<15} {100 * r['value']:.3f}% / "
              f"{100 * zero[(r['model'], r['granularity'])]:.3f}%")
    fp8 = {(r["model"], r["granularity"], r["metric"]): r["value"] for r in records
           if r["format"] == "fp8" and "value" in r and r["snapshot_step"] == last}
    print("FP8 relative error (%) without each 16-element block's largest element (row / block32 / block16), and the "
          "share of the squared norm those elements hold, at the last snapshot:")
    for name in dict.fromkeys(r["model"] for r in records):
        errs = " / ".join(f"{100 * fp8[(name, g, 'state_rel_excl_block16_max')]:.2f}"
                          for g in ("row", "block32", "block16"))
        print(f"  {name:<20} {errs}; share {100 * fp8[(name, 'row', 'block16_max_energy_share')]:.0f}%")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
