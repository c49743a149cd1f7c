"""Kernel benchmark runner: every (model, state dtype, batch) case for our replay / baseline ops and the peers.

Protocol (docs/benchmarks.md): copy ceiling measured first in the same run; cold L2 by rotating independent pools whose
total exceeds 4x L2, all inside one CUDA graph of L steps x pools back-to-back calls (whole L-cycles for the replay
kernels, staggered cursors); median of >= 15 graph replays; slot pool of batch + 1 with a random slot permutation.
"""
from __future__ import annotations

import datetime as _dt
import gc
import platform
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from trtllm_replayssm.core.families import family_of
from trtllm_replayssm.core.formats import StateSpec, parse_state_label
from trtllm_replayssm.core.limits import MAX_BUFFER_LEN
from trtllm_replayssm.core.ops import conv
from trtllm_replayssm.core.plans import Tuning
from trtllm_replayssm.core.samples import DeltaStep, Mamba2Step

from trtllm_replayssm.core import byte_model as core_bytes

from . import byte_model, ours, peers, timing
from .peers import PeerCase, PeerUnavailable
from .shapes import BenchShape, select_shapes

DEFAULT_BATCHES: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 256, 512)
DEFAULT_STATE_DTYPES: tuple[str, ...] = ("fp32", "bf16")
BOTH_MODES_MAX_BATCH = 8  # at batch <= this, our replay is also recorded in modes fused, flush and auto


@dataclass
class KernelBenchConfig:
    """What to run. ``buffer_len`` is our L and FlashInfer's window (ring R = L + 1). ``neighbour``: the kernel every
    timed call follows, whose own time, timed alone, is subtracted (NEIGHBOURS; None: none). ``tuning``: our ops'
    planner knobs (``bench kernels --served-launch``: the TensorRT-LLM module's behind upstream's conv,
    ``SERVING_TUNING``)."""

    families: list[str]
    models: list[str] | None = None
    batches: list[int] = field(default_factory=lambda: list(DEFAULT_BATCHES))
    state_dtypes: list[str] = field(default_factory=lambda: list(DEFAULT_STATE_DTYPES))
    buffer_len: int = 16
    peers: bool = True
    peer_impls: tuple[str, ...] | None = None  # the peers to time (None: every peer of each family)
    replays: int = timing.MIN_REPLAYS
    seed: int = 0
    neighbour: str | None = None
    tuning: Tuning = ours.DEFAULT_TUNING

    def __post_init__(self) -> None:
        if not self.batches or any(not isinstance(b, int) or b < 1 for b in self.batches):
            raise ValueError(f"batches: expected positive ints, got {self.batches!r}")
        if not self.state_dtypes:
            raise ValueError("state_dtypes: expected at least one state (fp32, bf16, fp8, nvfp4/dual/fp16, ...)")
        for sd in self.state_dtypes:
            parse_state_label(sd, arg="state_dtypes")
        if not isinstance(self.buffer_len, int) or not 1 <= self.buffer_len <= MAX_BUFFER_LEN:
            raise ValueError(f"buffer_len: expected an int in [1, {MAX_BUFFER_LEN}], got {self.buffer_len!r}")
        if self.neighbour is not None and self.neighbour not in NEIGHBOURS:
            raise ValueError(f"neighbour: expected one of {sorted(NEIGHBOURS)} or None, got {self.neighbour!r}")
        if self.replays < timing.MIN_REPLAYS:
            raise ValueError(f"replays: expected >= {timing.MIN_REPLAYS}, got {self.replays}")
        self.shapes: list[BenchShape] = select_shapes(self.families, self.models)


@dataclass
class Record:
    """One timed (impl, case). ``bytes_per_call`` comes from the byte model for all `batch` rows."""

    family: str
    model: str
    impl: str
    batch: int
    state_dtype: str  # the spec's label (fp32, nvfp4, nvfp4/dual/fp16+sr, ...)
    L: int
    median_us: float
    bytes_per_call: float
    model_gbps: float
    pct_of_copy: float
    mode: str | None = None  # ours: requested mode; resolved_mode is what the op ran (its plan's mode)
    resolved_mode: str | None = None
    plan: dict | None = None  # ours: the launch plan the op ran
    variant: str = ""
    n_pools: int = 0
    calls_per_graph: int = 0
    finite: bool | None = None
    notes: str = ""
    state_format: str = "fp32"  # the StateSpec's fields (docs/benchmarks.md, results schema)
    state_mode: str = "plain"
    master_format: str | None = None
    stochastic_rounding: bool = False
    neighbour: str | None = None  # the kernel each call followed (KernelBenchConfig.neighbour)
    neighbour_us: float | None = None  # that kernel's own µs, subtracted from median_us


def _modes(shape: BenchShape, batch: int, state_dtype: StateSpec, buffer_len: int,
           device: torch.device) -> list[str]:
    """Modes recorded for our replay: every one at small batch or wherever ``auto`` would not replay, else
    ``replay``."""
    every = ["replay", "fused", "flush", "auto"]
    if batch <= BOTH_MODES_MAX_BATCH:
        return every
    auto_replays = ours.planned_mode(shape, batch, state_dtype, buffer_len, "auto", device) == "replay"
    return ["replay"] if auto_replays else every


def _cycle(calls: list[Callable[[], None]], steps: int) -> list[Callable[[], None]]:
    """`steps` decode steps of every pool, pools interleaved (each pool advances one whole cycle per graph)."""
    return [fn for _ in range(steps) for fn in calls]


def _finite(outputs: list[torch.Tensor]) -> bool | None:
    if not outputs:
        return None
    return all(bool(torch.isfinite(o.float()).all()) for o in outputs)


Timer = Callable[[list[Callable[[], None]], int], float]  # (calls, replays) -> median µs per call


def plain_neighbour(batch: int, device: torch.device) -> Callable[[], None]:
    """An elementwise kernel over a bf16 [batch, 8192] tensor, launched plainly by PyTorch: a stand-in for the kernel
    a model runs before its SSM op, one that does not let its dependents launch early (TensorRT-LLM's conv1d and
    copies before the Mamba-2 decode of a mixed batch's decode rows)."""
    scratch = torch.zeros(batch, 8192, dtype=torch.bfloat16, device=device)
    return lambda: scratch.add_(1.0)


def conv_neighbour(shape: BenchShape, batch: int, device: torch.device) -> Callable[[], None]:
    """Our conv1d decode step (``ops.conv``) over the layer's conv channels, bf16, on a pool of ``batch + 1`` slots
    with upstream's numerics: what the TensorRT-LLM module runs right before the decode op of a pure-decode batch, a
    kernel that lets its dependents launch at once."""
    gen = torch.Generator().manual_seed(batch)
    channels, width = shape.dims.conv_dim, shape.dims.conv_kernel
    x = torch.randn(batch, channels, generator=gen).to(device=device, dtype=torch.bfloat16)
    pool = torch.randn(batch + 1, channels, width - 1, generator=gen).to(device=device, dtype=torch.bfloat16)
    weight = torch.randn(channels, width, generator=gen).to(device=device, dtype=torch.bfloat16)
    slots = torch.randperm(batch + 1, generator=gen)[:batch].to(device=device, dtype=torch.int32)
    out = torch.empty_like(x)
    return lambda: conv.conv1d_update(x, pool, weight, None, True, slots, out=out, round_once=True)


NEIGHBOURS: dict[str, Callable[[BenchShape, int, torch.device], Callable[[], None]]] = {
    "plain": lambda shape, batch, device: plain_neighbour(batch, device),
    "conv": conv_neighbour,
}


def _after(calls: list[Callable[[], None]], neighbour: Callable[[], None] | None) -> list[Callable[[], None]]:
    """`calls`, each preceded by `neighbour` (None: as they are)."""
    return calls if neighbour is None else [fn for call in calls for fn in (neighbour, call)]


def neighbour_time(neighbour: Callable[[], None], steps: int, n_pools: int, replays: int, timer: Timer) -> float:
    """The plain kernel's own median µs per launch, timed alone in a graph as long as a case's (``steps`` calls of
    each of ``n_pools`` pools): what :func:`time_case` with that neighbour adds to a call."""
    return timer([neighbour] * (steps * n_pools), replays)


def time_case(case: PeerCase, steps: int, replays: int, timer: Timer,
              neighbour: Callable[[], None] | None = None) -> tuple[float, str]:
    """Median µs per call, each call after `neighbour` if given (µs per pair of launches); with alternatives (e.g.
    algorithms) the fastest one and its name."""
    per = 1 if neighbour is None else 2
    if case.alternatives:
        return min((per * timer(_after(_cycle(c, steps), neighbour), replays), name)
                   for name, c in case.alternatives.items())
    return per * timer(_after(_cycle(case.calls, steps), neighbour), replays), case.variant


def run_kernel_bench(config: KernelBenchConfig, device: torch.device | None = None,
                     log: Callable[[str], None] = print,
                     progress: Callable[[dict], None] | None = None) -> dict:
    """Run the benchmark and return the results dict (``device``, ``date``, ``copy_ceiling_gbps``, versions,
    ``records``, ``skipped``). `progress` receives the partial results after every case (e.g. to save them)."""
    if not torch.cuda.is_available():
        raise RuntimeError("the kernel benchmark needs a CUDA device; torch.cuda.is_available() is False")
    device = device or torch.device("cuda", torch.cuda.current_device())
    props = torch.cuda.get_device_properties(device)
    copy_gbps = timing.copy_ceiling_gbps(device)
    l2 = timing.l2_bytes(device)
    log(f"{props.name}: copy ceiling {copy_gbps:.0f} GB/s, L2 {l2 / 1e6:.0f} MB, {props.multi_processor_count} SMs")
    results = {
        "device": props.name,
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "copy_ceiling_gbps": copy_gbps,
        "l2_bytes": l2,
        "sm_count": props.multi_processor_count,
        "buffer_len": config.buffer_len,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "peer_versions": peers.peer_versions(),
        "records": [],
        "skipped": [],
    }
    for shape in config.shapes:
        for sd in config.state_dtypes:
            for batch in config.batches:
                recs = _run_case(config, shape, sd, batch, copy_gbps, l2, results["skipped"], device, log)
                results["records"] += [asdict(r) for r in recs]
                if progress is not None:
                    progress(results)
    return results


def case_inputs(shape: BenchShape, sd: str, batch: int, l2: int, device: torch.device,
                seed_prefix: str = "") -> tuple[torch.Generator, Mamba2Step | DeltaStep, int]:
    """What every implementation of one case shares: a generator seeded from ``seed_prefix`` and the case, the step's
    inputs, and the number of state pools that keeps L2 (``l2`` bytes) cold."""
    gen = torch.Generator().manual_seed(zlib.crc32(f"{seed_prefix}{shape.model}/{sd}/{batch}".encode()))
    step = family_of(shape.dims).random_step(shape.dims, batch, gen, device)
    spec = parse_state_label(sd, arg="state_dtype")
    return gen, step, timing.pools_for_cold_l2(int((batch + 1) * core_bytes.state_bytes(shape.dims, spec)), l2)


def _run_case(config: KernelBenchConfig, shape: BenchShape, sd: str, batch: int, copy_gbps: float, l2: int,
              skipped: list[dict], device: torch.device, log: Callable[[str], None],
              timer: Timer = timing.time_calls) -> list[Record]:
    L = config.buffer_len
    spec = parse_state_label(sd, arg="state_dtype")
    gen, step, n_pools = case_inputs(shape, sd, batch, l2, device, seed_prefix=f"{config.seed}/")
    builders: list[tuple[str, str | None, Callable[[], PeerCase]]] = []
    for mode in _modes(shape, batch, spec, L, device):
        builders.append(("replay", mode, lambda m=mode: ours.replay_case(shape, batch, spec, step, n_pools, L, m,
                                                                           gen, device, config.tuning)))
    if spec.stochastic_rounding:  # the baseline update has no write counter (docs/design.md, quantized state)
        skipped.append(dict(family=shape.family, model=shape.model, impl="baseline", batch=batch, state_dtype=sd,
                            mode=None, reason="stochastic rounding: the baseline update has no write counter"))
    else:
        builders.append(("baseline", None, lambda: ours.baseline_case(shape, batch, spec, step, n_pools, gen,
                                                                      device, config.tuning)))
    if config.peers:
        for impl in (i for i in peers.PEERS_BY_FAMILY[shape.family]
                     if config.peer_impls is None or i in config.peer_impls):
            builders.append((impl, None, lambda i=impl: peers.build_peer(i, shape, batch, sd, step, n_pools, L, gen,
                                                                          device)))
    neighbour = NEIGHBOURS[config.neighbour](shape, batch, device) if config.neighbour else None
    neighbour_us = neighbour_time(neighbour, L, n_pools, config.replays, timer) if neighbour is not None else None
    out: list[Record] = []
    for impl, mode, build in builders:
        where = dict(family=shape.family, model=shape.model, impl=impl, batch=batch, state_dtype=sd, mode=mode)
        try:
            case = build()
            us, variant = time_case(case, L, config.replays, timer, neighbour)
            us -= neighbour_us or 0.0
        except PeerUnavailable as exc:
            skipped.append({**where, "reason": str(exc)})
            log(f"  skip {impl} {shape.model} {sd} b={batch}: {exc}")
            continue
        except Exception as exc:  # a failing impl must not lose the rest of the run; record why
            skipped.append({**where, "reason": f"error: {type(exc).__name__}: {exc}"})
            log(f"  FAIL {impl} {shape.model} {sd} b={batch}: {type(exc).__name__}: {exc}")
            _release()
            continue
        resolved = case.plan["mode"] if impl == "replay" else None
        nbytes = batch * byte_model.step_bytes(impl, shape, spec, L, resolved)
        gbps = nbytes / (us * 1e-6) / 1e9
        rec = Record(shape.family, shape.model, impl, batch, sd, L, us, nbytes, gbps, 100.0 * gbps / copy_gbps,
                     mode=mode, resolved_mode=resolved, plan=case.plan, variant=variant, n_pools=n_pools,
                     calls_per_graph=L * n_pools, finite=_finite(case.outputs), notes=case.notes,
                     neighbour=config.neighbour, neighbour_us=neighbour_us, **spec.to_dict())
        out.append(rec)
        log(f"  {shape.model:22s} {sd} b={batch:<4d} {impl + ('/' + mode if mode else ''):34s} "
            f"{us:9.2f} us {gbps:7.0f} GB/s {rec.pct_of_copy:5.1f}% of copy")
        del case
        _release()
    return out


def _release() -> None:
    gc.collect()
    torch.cuda.empty_cache()
