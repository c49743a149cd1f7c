"""Adapters for the peer kernels run side by side : FlashInfer, mamba-ssm (Triton SSU), fla-core.

Each adapter builds, for one (shape, batch, state dtype), a list of step callables (one per independent pool, each
one decode step of `batch` rows; for the speculative peers, :data:`SPEC_PEERS`, one verify step of T tokens with its
commit) or raises :class:`PeerUnavailable` with the reason (not importable, unsupported shape, no prebuilt module).
Peers are optional: importing this module imports none of them.
"""
from __future__ import annotations

import functools
import importlib
import os
import sys
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch

from trtllm_replayssm.core.formats import get_state_format, parse_state_label, torch_dtype
from trtllm_replayssm.core.quant import quantize_fp8_rows
from trtllm_replayssm.core.samples import DeltaStep, Mamba2Step, random_state, slot_indices

from .flashinfer_aot import CheckpointingSsuModule, SsuModule
from .shapes import BenchShape

MAMBA_SSM_SRC_ENV = "REPLAYSSM_MAMBA_SSM_SRC"
DEFAULT_MAMBA_SSM_SRC = Path(".whl/mamba_ssm_src")
FLASHINFER_SSU_ALGORITHMS = ("auto", "simple", "vertical")


class PeerUnavailable(RuntimeError):
    """The peer cannot run this case; ``str(exc)`` is the recorded reason."""


@dataclass
class PeerCase:
    """Step callables of one peer for one case: ``calls[p]`` runs one decode step on pool p."""

    impl: str
    calls: list[Callable[[], None]]
    variant: str = ""
    notes: str = ""
    outputs: list[torch.Tensor] = field(default_factory=list)  # checked for finiteness after timing
    # alternative variants to time, the fastest is kept (e.g. FlashInfer SSU algorithms): name -> calls
    alternatives: dict[str, list[Callable[[], None]]] = field(default_factory=dict)
    plan: dict | None = None  # ours: the launch plan the op ran (core/plans.py LaunchPlan.record)


def _import(name: str) -> types.ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as exc:  # ImportError, or a missing shared library / CUDA init error inside the package
        raise PeerUnavailable(f"import {name} failed: {type(exc).__name__}: {exc}") from exc


def _version(dist: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(dist)
    except PackageNotFoundError:
        return None


def peer_versions() -> dict[str, str | None]:
    """Installed versions of the peer packages (None when absent)."""
    out = {dist: _version(dist) for dist in ("flashinfer-python", "apache-tvm-ffi", "fla-core", "mamba-ssm")}
    src = _mamba_ssm_src()
    if out["mamba-ssm"] is None and src is not None:
        info = src / "PKG-INFO"  # the sdist's metadata, unpacked next to the sources
        lines = info.read_text().splitlines() if info.is_file() else []
        ver = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("Version:")), "unknown version")
        out["mamba-ssm"] = f"{ver} (Triton SSU from the sdist)"
    return out


# --------------------------------------------------------------------------------------------------- Mamba-2 views


@dataclass
class _TiedMamba2:
    """The peers' tie_hdim views of the per-head inputs: dt (..., H, P) with strides (..., 1, 0) (a decode step's
    [b,H] or a window's [b,T,H]); A (H,P,N); D, dt_bias (H,P); all fp32."""

    dt: torch.Tensor
    A: torch.Tensor
    D: torch.Tensor
    dt_bias: torch.Tensor


def _tied(shape: BenchShape, step: Mamba2Step) -> _TiedMamba2:
    H, P, N = shape.dims.heads, shape.dims.rows, shape.dims.cols
    return _TiedMamba2(
        dt=step.dt[..., None].expand(*step.dt.shape, P),
        A=step.A[:, None, None].expand(H, P, N),
        D=step.D[:, None].expand(H, P),
        dt_bias=step.dt_bias[:, None].expand(H, P),
    )


def _pools(n_pools: int, batch: int, gen: torch.Generator, device: torch.device) -> list[torch.Tensor]:
    return [slot_indices(batch, gen, device) for _ in range(n_pools)]


# ------------------------------------------------------------------------------------------------------ FlashInfer


def _check_ssu_shape(impl: str, shape: BenchShape) -> None:
    """PeerUnavailable unless FlashInfer's ``selective_state_update`` compiles for `shape`."""
    if shape.family != "mamba2":
        raise PeerUnavailable(f"{impl} is a Mamba-2 kernel, not {shape.family}")
    if shape.dims.rows % 64 and _version("flashinfer-python") in ("0.7.0", "0.7.0.post1"):
        raise PeerUnavailable(f"selective_state_update (FlashInfer {_version('flashinfer-python')}) does not compile "
                              f"for head_dim {shape.dims.rows}: static_assert DIM_PER_CTA % ROWS_PER_PASS == 0 in its "
                              f"MTP-simple kernel (later 0.7.x releases fix head dims that are not multiples of 64)")


def _check_checkpointing_shape(impl: str, shape: BenchShape) -> None:
    """PeerUnavailable unless FlashInfer's ``checkpointing_ssu`` compiles for `shape`."""
    if shape.family != "mamba2":
        raise PeerUnavailable(f"{impl} is a Mamba-2 kernel, not {shape.family}")
    if shape.dims.rows % 32:
        raise PeerUnavailable(f"checkpointing_ssu (FlashInfer 0.7.0.post1) does not compile for head_dim "
                              f"{shape.dims.rows}: its split tactics need head_dim / 2 to be a multiple of 16")


def _require_built(module: SsuModule | CheckpointingSsuModule) -> None:
    """PeerUnavailable unless FlashInfer's sm_90 module for the case is prebuilt (or already JIT-built): building one
    takes minutes, which the benchmark does not spend."""
    spec = module.spec()
    if not spec.is_compiled:
        raise PeerUnavailable(f"FlashInfer module {spec.name} is not prebuilt (lab/bench/flashinfer_aot.py "
                              f"--tokens {module.tokens} builds it)")


def _autotune(fi: types.ModuleType, call: Callable[[], None], what: str, device: torch.device) -> None:
    """Run `call` once under ``flashinfer.autotune(True)`` (tactics cached for the later calls), or PeerUnavailable."""
    try:
        with fi.autotune(True):
            call()
        torch.cuda.synchronize(device)
    except Exception as exc:
        raise PeerUnavailable(f"{what} failed: {type(exc).__name__}: {exc}") from exc


def flashinfer_ssu(shape: BenchShape, batch: int, state_dtype: str, step: Mamba2Step, n_pools: int,
                   gen: torch.Generator, device: torch.device) -> PeerCase:
    """``flashinfer.mamba.selective_state_update`` (STP), each of auto/simple/vertical timed; the fastest is kept."""
    _check_ssu_shape("flashinfer_ssu", shape)
    fim = _import("flashinfer.mamba")
    tied = _tied(shape, step)
    out = torch.empty_like(step.x)
    states = [random_state(batch + 1, shape.dims, state_dtype, gen, device) for _ in range(n_pools)]
    idx = _pools(n_pools, batch, gen, device)

    def make(algorithm: str) -> list[Callable[[], None]]:
        def call(p: int) -> Callable[[], None]:
            return lambda: fim.selective_state_update(
                states[p], step.x, tied.dt, tied.A, step.B, step.C, tied.D, z=None, dt_bias=tied.dt_bias,
                dt_softplus=True, state_batch_indices=idx[p], pad_slot_id=-1, out=out, algorithm=algorithm)
        return [call(p) for p in range(n_pools)]

    alts = {}
    for algorithm in FLASHINFER_SSU_ALGORITHMS:
        calls = make(algorithm)
        try:
            calls[0]()  # JIT load / unsupported-configuration errors surface here
        except Exception as exc:  # one algorithm may be unsupported for a shape; keep the others
            alts[algorithm] = exc
            continue
        alts[algorithm] = calls
    ok = {k: v for k, v in alts.items() if not isinstance(v, Exception)}
    if not ok:
        raise PeerUnavailable("; ".join(f"{k}: {type(v).__name__}: {v}" for k, v in alts.items()))
    failed = {k: f"{type(v).__name__}: {v}" for k, v in alts.items() if isinstance(v, Exception)}
    notes = "; ".join(f"algorithm {k} failed ({v})" for k, v in failed.items())
    first = next(iter(ok))
    return PeerCase("flashinfer_ssu", ok[first], variant=first, notes=notes, outputs=[out], alternatives=ok)


def flashinfer_ssu_mtp(shape: BenchShape, batch: int, state_dtype: str, step: Mamba2Step, accepted: torch.Tensor,
                       n_pools: int, gen: torch.Generator, device: torch.device) -> PeerCase:
    """Per-draft-state verify with ``selective_state_update`` over a window ``step`` (x [b,T,H,P]): the state after
    each window token into ``intermediate_states_buffer`` [b,T,H,P,N] (the pool's state left as it was), then each
    row's slot <- the state after its ``accepted[b]`` tokens ([b] int32; a torch gather + ``index_copy_``, in the
    step). Algorithm ``auto`` (``simple`` on sm_90); ``num_accepted_tokens`` None (the prebuilt int64 module)."""
    _check_ssu_shape("flashinfer_ssu_mtp", shape)
    fim = _import("flashinfer.mamba")
    T, H, P, N = step.x.shape[1], shape.dims.heads, shape.dims.rows, shape.dims.cols
    _require_built(SsuModule(torch_dtype(state_dtype), P, N, tokens=T))
    tied = _tied(shape, step)
    out = torch.empty_like(step.x)
    buffer_rows = torch.arange(batch, dtype=torch.int32, device=device)  # row b's intermediate states: buffer[b]
    before_first = torch.arange(batch, device=device) * T - 1  # + accepted[b]: row b's accepted state in buffer[b*T:]
    idx = _pools(n_pools, batch, gen, device)
    pools = [(random_state(batch + 1, shape.dims, state_dtype, gen, device),
              torch.empty(batch, T, H, P, N, dtype=torch_dtype(state_dtype), device=device), idx[p], idx[p].long())
             for p in range(n_pools)]

    def call(p: int) -> Callable[[], None]:
        state, inter, sbi, slots = pools[p]

        def run() -> None:
            fim.selective_state_update(
                state, step.x, tied.dt, tied.A, step.B, step.C, tied.D, z=None, dt_bias=tied.dt_bias,
                dt_softplus=True, state_batch_indices=sbi, pad_slot_id=-1, out=out, disable_state_update=True,
                intermediate_states_buffer=inter, intermediate_state_indices=buffer_rows, cache_steps=T,
                algorithm="auto")
            state.index_copy_(0, slots, inter.flatten(0, 1).index_select(0, before_first + accepted))
        return run

    calls = [call(p) for p in range(n_pools)]
    try:
        calls[0]()
        torch.cuda.synchronize(device)
    except Exception as exc:
        raise PeerUnavailable(f"selective_state_update (T={T}) failed: {type(exc).__name__}: {exc}") from exc
    return PeerCase("flashinfer_ssu_mtp", calls, variant="auto", outputs=[out],
                    notes="commit: torch gather + index_copy_ in the timed step")


def _checkpointing_fp8(state_dtype: str) -> bool:
    """Whether `state_dtype` is ``checkpointing_ssu``'s FP8 state (PeerUnavailable for another stored format: its
    8-bit state is our shared ``fp8`` checkpoint, rounded to nearest)."""
    spec = parse_state_label(state_dtype, arg="state_dtype")
    if spec.stored and spec.label != "fp8":
        raise PeerUnavailable(f"checkpointing_ssu has no {spec.label} state (only plain and shared fp8 states)")
    return spec.stored


def _checkpointing_state(shape: BenchShape, slots: int, state_dtype: str, gen: torch.Generator,
                         device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    """A random ``checkpointing_ssu`` state pool and its ``state_scale``: a plain dtype (scale None) or ``fp8``,
    E4M3 codes with an fp32 decode scale per (slot, head, state row), which is also our FP8 checkpoint's layout
    (the adapter has refused other stored formats: _checkpointing_fp8)."""
    if not parse_state_label(state_dtype, arg="state_dtype").stored:
        return random_state(slots, shape.dims, state_dtype, gen, device), None
    codes, scale = quantize_fp8_rows(random_state(slots, shape.dims, "fp32", gen, device))
    return codes.to(get_state_format("fp8").storage_dtype), scale


def _ring_pool(shape: BenchShape, slots: int, ring: int, state_dtype: str, act: torch.dtype,
               gen: torch.Generator, device: torch.device) -> dict[str, torch.Tensor | None]:
    """One ``checkpointing_ssu`` pool of `slots` slots: the state (and its ``state_scale``, FP8 only), random ring
    records of `ring` rows (x and B in `act`, Δ after bias + softplus in [1e-3, 1e-1]) and zeroed trackers
    ``ring_start`` / ``prev``."""
    H, P, N, G = shape.dims.heads, shape.dims.rows, shape.dims.cols, shape.dims.key_heads
    dev_gen = torch.Generator(device=device).manual_seed(int(torch.randint(0, 2**31 - 1, (1,), generator=gen)))
    state, state_scale = _checkpointing_state(shape, slots, state_dtype, gen, device)
    return {
        "state": state,
        "state_scale": state_scale,
        "x_cache": torch.empty(slots, H, ring, P, dtype=act, device=device).normal_(0, 0.1, generator=dev_gen),
        "B_cache": torch.empty(slots, G, ring, N, dtype=act, device=device).normal_(0, 0.1, generator=dev_gen),
        "dt_cache": torch.empty(slots, H, ring, device=device).uniform_(1e-3, 1e-1, generator=dev_gen),
        "ring_start": torch.zeros(slots, dtype=torch.int32, device=device),
        "prev": torch.zeros(slots, dtype=torch.int32, device=device),
    }


@functools.cache
def _tracker_kernel():
    """A one-launch Triton kernel advancing FlashInfer's ring trackers for single-token decode (like vLLM's)."""
    triton = _import("triton")
    tl = _import("triton.language")

    @triton.jit
    def advance(idx_ptr, ring_start_ptr, prev_ptr, n, window, ring_len, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        slot = tl.load(idx_ptr + offs, mask=mask, other=0)
        prev = tl.load(prev_ptr + slot, mask=mask, other=0)
        start = tl.load(ring_start_ptr + slot, mask=mask, other=0)
        flush = prev + 1 > window
        tl.store(ring_start_ptr + slot, tl.where(flush, (start + prev) % ring_len, start), mask=mask)
        tl.store(prev_ptr + slot, tl.where(flush, 1, prev + 1), mask=mask)

    return advance


def flashinfer_checkpointing_ssu(shape: BenchShape, batch: int, state_dtype: str, step: Mamba2Step, n_pools: int,
                                 window: int, gen: torch.Generator, device: torch.device) -> PeerCase:
    """``flashinfer.mamba.checkpointing_ssu`` (ring API of 0.7.x, T = 1, R = window + 1), autotuned once under
    ``flashinfer.autotune(True)``; the per-call tracker update (one small Triton kernel) is part of each step. An
    ``fp8`` state runs FlashInfer's monolithic 8-bit kernel (it has no two-kernel split for 8-bit states)."""
    _check_checkpointing_shape("flashinfer_checkpointing_ssu", shape)
    fp8 = _checkpointing_fp8(state_dtype)
    fi = _import("flashinfer")
    fim = _import("flashinfer.mamba")
    if fp8:
        _require_built(CheckpointingSsuModule(torch.float8_e4m3fn, shape.dims.rows, shape.dims.heads,
                                              shape.dims.key_heads, window, shape.dims.cols))
    advance = _tracker_kernel()
    R = window + 1
    x4 = step.x[:, None]
    B4, C4 = step.B[:, None], step.C[:, None]
    tied = _tied(shape, step)
    dt4 = tied.dt[:, None]
    out = torch.empty_like(x4)
    scratch = (None,) * 3 if fp8 else fim.allocate_checkpointing_ssu_scratch(batch, shape.dims.heads, 1, window,
                                                                            step.x.dtype, device)
    idx = _pools(n_pools, batch, gen, device)
    pools = []
    for p in range(n_pools):
        pool = _ring_pool(shape, batch + 1, R, state_dtype, step.x.dtype, gen, device)
        pool["prev"][idx[p].long()] = torch.arange(batch, dtype=torch.int32, device=device) % window  # staggered
        pool["prev0"] = pool["prev"].clone()
        pools.append(pool)
    block = 256
    grid = ((batch + block - 1) // block,)

    def call(p: int) -> Callable[[], None]:
        pool = pools[p]

        def run() -> None:
            fim.checkpointing_ssu(
                pool["state"], pool["x_cache"], pool["B_cache"], pool["dt_cache"], pool["ring_start"], pool["prev"],
                x4, dt4, tied.A, B4, C4, out, D=tied.D, z=None, dt_bias=tied.dt_bias, dt_softplus=True,
                state_batch_indices=idx[p], pad_slot_id=-1, state_scale=pool["state_scale"], cb_scaled=scratch[0],
                cumAdt_vec=scratch[1], cb_old=scratch[2], algorithm="monolith" if fp8 else "auto")
            advance[grid](idx[p], pool["ring_start"], pool["prev"], batch, window, R, BLOCK=block)
        return run

    calls = [call(p) for p in range(n_pools)]
    dims = shape.dims
    _autotune(fi, calls[0], f"checkpointing_ssu for P={dims.rows}, H={dims.heads}, G={dims.key_heads}", device)
    for pool in pools:  # restore the staggered trackers after the tuning call
        pool["ring_start"].zero_()
        pool["prev"].copy_(pool["prev0"])
    return PeerCase("flashinfer_checkpointing_ssu", calls, variant=f"{'monolith' if fp8 else 'autotuned'}, R={R}",
                    notes="tracker update (1 Triton launch) in the timed step", outputs=[out])


def advance_checkpointing_ring_(ring_start: torch.Tensor, prev: torch.Tensor, accepted: torch.Tensor,
                                slots: torch.Tensor, tokens: int, max_window: int) -> torch.Tensor:
    """The caller's bookkeeping after a ``checkpointing_ssu`` call of `tokens` tokens per row (the kernel reads the
    trackers, never writes them): a row with ``prev + tokens > max_window`` flushed, so its ``ring_start`` moves past
    the ``prev`` replayed records (mod R = max_window + tokens) and ``prev`` becomes its accepted count; any other row
    adds its accepted count to ``prev``. ``ring_start`` / ``prev`` [slots] int32 are updated at `slots` ([b] int64);
    ``accepted`` [b] int32 in 1..tokens. Torch ops on the trackers' device; returns the rows' flush mask [b]."""
    start, count = ring_start[slots], prev[slots]
    flush = count > max_window - tokens
    ring_start.index_copy_(0, slots, torch.where(flush, (start + count) % (max_window + tokens), start))
    prev.index_copy_(0, slots, torch.where(flush, 0, count) + accepted)
    return flush


def flashinfer_checkpointing_ssu_spec(shape: BenchShape, batch: int, state_dtype: str, step: Mamba2Step,
                                      accepted: torch.Tensor, max_window: int, starts: list[tuple[int, int]],
                                      n_pools: int, gen: torch.Generator, device: torch.device) -> PeerCase:
    """``checkpointing_ssu`` verifying a window ``step`` (x [b,T,H,P]) on rings of R = max_window + T rows with the
    scratch trio, autotuned once like the T = 1 adapter. Each step is the call plus the trackers' bookkeeping with the
    fixed counts ``accepted`` ([b] int32; :func:`advance_checkpointing_ring_`, torch ops). ``starts``: row b's initial
    ``(ring_start, prev_num_accepted_tokens)``."""
    _check_checkpointing_shape("flashinfer_checkpointing_ssu", shape)
    T, H, P, N, G = step.x.shape[1], shape.dims.heads, shape.dims.rows, shape.dims.cols, shape.dims.key_heads
    if not T <= max_window <= 16:
        raise PeerUnavailable(f"checkpointing_ssu needs T <= max_window <= 16, got T={T}, max_window={max_window}")
    fi = _import("flashinfer")
    fim = _import("flashinfer.mamba")
    _require_built(CheckpointingSsuModule(torch_dtype(state_dtype), P, H, G, max_window, N, tokens=T))
    R = max_window + T
    tied = _tied(shape, step)
    out = torch.empty_like(step.x)
    scratch = fim.allocate_checkpointing_ssu_scratch(batch, H, T, max_window, step.x.dtype, device)
    trackers = torch.tensor(starts, dtype=torch.int32, device=device)  # [b, 2]
    idx = _pools(n_pools, batch, gen, device)
    pools = []
    for p in range(n_pools):
        pool = _ring_pool(shape, batch + 1, R, state_dtype, step.x.dtype, gen, device)
        pool["slots"] = idx[p].long()
        pool["ring_start"][pool["slots"]] = trackers[:, 0]
        pool["prev"][pool["slots"]] = trackers[:, 1]
        pools.append(pool)

    def call(p: int) -> Callable[[], None]:
        pool = pools[p]

        def run() -> None:
            fim.checkpointing_ssu(
                pool["state"], pool["x_cache"], pool["B_cache"], pool["dt_cache"], pool["ring_start"], pool["prev"],
                step.x, tied.dt, tied.A, step.B, step.C, out, D=tied.D, z=None, dt_bias=tied.dt_bias,
                dt_softplus=True, state_batch_indices=idx[p], pad_slot_id=-1, cb_scaled=scratch[0],
                cumAdt_vec=scratch[1], cb_old=scratch[2], algorithm="auto")
            advance_checkpointing_ring_(pool["ring_start"], pool["prev"], accepted, pool["slots"], T, max_window)
        return run

    calls = [call(p) for p in range(n_pools)]
    _autotune(fi, calls[0], f"checkpointing_ssu for T={T}, R={R}, P={P}, H={H}, G={G}", device)
    return PeerCase("flashinfer_checkpointing_ssu", calls, variant=f"autotuned, T={T}, R={R}", outputs=[out],
                    notes="tracker bookkeeping (torch ops) in the timed step")


# ------------------------------------------------------------------------------------------------------- mamba-ssm


def _mamba_ssm_src() -> Path | None:
    root = Path(os.environ.get(MAMBA_SSM_SRC_ENV, DEFAULT_MAMBA_SSM_SRC))
    return root if (root / "mamba_ssm" / "ops" / "triton" / "selective_state_update.py").is_file() else None


def _import_mamba_ssm_ssu() -> Callable[..., torch.Tensor]:
    """Import mamba-ssm's Triton SSU without its CUDA extension: register a bare namespace module
    ``mamba_ssm`` pointing at the unpacked source so the real top-level ``__init__`` never runs."""
    if "mamba_ssm" not in sys.modules:
        src = _mamba_ssm_src()
        if src is None:
            raise PeerUnavailable(f"mamba_ssm source not found (set {MAMBA_SSM_SRC_ENV} to the unpacked sdist root)")
        pkg = types.ModuleType("mamba_ssm")
        pkg.__path__ = [str(src / "mamba_ssm")]
        sys.modules["mamba_ssm"] = pkg
    return _import("mamba_ssm.ops.triton.selective_state_update").selective_state_update


def mamba_ssm_ssu(shape: BenchShape, batch: int, state_dtype: str, step: Mamba2Step, n_pools: int,
                  gen: torch.Generator, device: torch.device) -> PeerCase:
    """mamba-ssm 2.3.2.post1 Triton ``selective_state_update`` (allocates its output every call)."""
    if shape.family != "mamba2":
        raise PeerUnavailable(f"mamba_ssm_ssu is a Mamba-2 kernel, not {shape.family}")
    ssu = _import_mamba_ssm_ssu()
    tied = _tied(shape, step)
    states = [random_state(batch + 1, shape.dims, state_dtype, gen, device) for _ in range(n_pools)]
    idx = _pools(n_pools, batch, gen, device)
    calls = [
        (lambda p=p: ssu(states[p], step.x, tied.dt, tied.A, step.B, step.C, D=tied.D, z=None, dt_bias=tied.dt_bias,
                         dt_softplus=True, state_batch_indices=idx[p]))
        for p in range(n_pools)
    ]
    return PeerCase("mamba_ssm_ssu", calls, variant="triton (hand-tuned BLOCK_M 4, 4 warps)")


# -------------------------------------------------------------------------------------------------------- fla-core


def fla_gdn(shape: BenchShape, batch: int, state_dtype: str, step: DeltaStep, n_pools: int,
            gen: torch.Generator, device: torch.device) -> PeerCase:
    """fla-core ``fused_recurrent_gated_delta_rule`` (public API: out of place, no slot pool, writes fp32 state),
    with the gate, beta sigmoid and q/k l2-norm fused in-kernel like our op."""
    if shape.family != "gdn":
        raise PeerUnavailable(f"fla_gdn is a GDN kernel, not {shape.family}")
    fn = _import("fla.ops.gated_delta_rule").fused_recurrent_gated_delta_rule
    q, k, v = step.q[:, None], step.k[:, None], step.v[:, None]
    a, b = step.a[:, None], step.b[:, None]
    states = [random_state(batch, shape.dims, state_dtype, gen, device) for _ in range(n_pools)]  # [b, HV, V, K]
    calls = [
        (lambda state=states[p]: fn(q, k, v, g=a, beta=b, initial_state=state, output_final_state=True,
                                    use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, A_log=step.A_log,
                                    dt_bias=step.dt_bias, use_beta_sigmoid_in_kernel=True, state_v_first=True))
        for p in range(n_pools)
    ]
    return PeerCase("fla_gdn", calls, variant="public API, out of place",
                    notes="fla-core 0.6.0 has no pool-indexed GDN decode; new fp32 final_state per call")


def fla_kda(shape: BenchShape, batch: int, state_dtype: str, step: DeltaStep, n_pools: int,
            gen: torch.Generator, device: torch.device) -> PeerCase:
    """fla-core ``fused_recurrent_kda_fwd`` in its in-place pooled form (``ssm_state_indices``, V-first state), with
    the gate, beta sigmoid and q/k l2-norm fused in-kernel like our op."""
    if shape.family != "kda":
        raise PeerUnavailable(f"fla_kda is a KDA kernel, not {shape.family}")
    return _fla_pooled("fla_kda", shape, batch, state_dtype, step, n_pools, gen, device)


def fla_gdn_pooled(shape: BenchShape, batch: int, state_dtype: str, step: DeltaStep, n_pools: int,
                   gen: torch.Generator, device: torch.device) -> PeerCase:
    """GDN on fla-core's in-place pooled recurrent kernel (``fused_recurrent_kda_fwd`` with ``ssm_state_indices``,
    the head's gate repeated along K: :func:`_fla_gate`): what a served GDN decode on fla-core pays for a slot pool,
    whose public GDN API (``fla_gdn``) takes no state indices and writes a fresh state."""
    if shape.family != "gdn":
        raise PeerUnavailable(f"fla_gdn_pooled is a GDN kernel, not {shape.family}")
    return _fla_pooled("fla_gdn_pooled", shape, batch, state_dtype, step, n_pools, gen, device)


def _fla_pooled(impl: str, shape: BenchShape, batch: int, state_dtype: str, step: DeltaStep, n_pools: int,
                gen: torch.Generator, device: torch.device) -> PeerCase:
    """One decode step per row on ``fused_recurrent_kda_fwd``, in place on a pool of batch + 1 slots."""
    fn = _import("fla.ops.kda.fused_recurrent").fused_recurrent_kda_fwd
    q, k, v = step.q[:, None].contiguous(), step.k[:, None].contiguous(), step.v[:, None].contiguous()
    b = step.b[:, None].contiguous()
    a, dt_bias = _fla_gate(shape, step)  # [b, HV, K], [HV*K]
    a = a[:, None]
    out = torch.empty_like(v)
    states = [random_state(batch + 1, shape.dims, state_dtype, gen, device) for _ in range(n_pools)]
    idx = _pools(n_pools, batch, gen, device)
    calls = [
        (lambda state=states[p], slots=idx[p]: fn(
            q, k, v, a, b, A_log=step.A_log, dt_bias=dt_bias, initial_state=state, inplace_final_state=True,
            state_v_first=True, ssm_state_indices=slots, use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
            use_beta_sigmoid_in_kernel=True, out=out))
        for p in range(n_pools)
    ]
    gate = "" if shape.family == "kda" else ", the GDN gate repeated along K"
    return PeerCase(impl, calls, variant=f"fused_recurrent_kda_fwd in place, pooled{gate}", outputs=[out])


def _fla_gate(shape: BenchShape, step: DeltaStep) -> tuple[torch.Tensor, torch.Tensor]:
    """The raw gate and its bias as ``fused_recurrent_kda_fwd`` takes them (``[b, T, HV, K]``, ``[HV*K]``): KDA's as
    they are; GDN's per-head gate repeated along the K channels, which gives every channel the head's log-gate."""
    a, bias = step.a, step.dt_bias
    if shape.family == "gdn":
        K = step.k.shape[-1]
        a, bias = a[..., None].expand(*a.shape, K), bias[:, None].expand(*bias.shape, K)
    return a.contiguous(), bias.reshape(-1).contiguous()


def fla_mtp(impl: str, shape: BenchShape, batch: int, state_dtype: str, step: DeltaStep, accepted: torch.Tensor,
            n_pools: int, gen: torch.Generator, device: torch.device) -> PeerCase:
    """Per-draft-state verify as vLLM runs it, on fla-core's ``fused_recurrent_kda_fwd`` (``IS_SPEC_DECODING``): each
    row owns T state slots (``ssm_state_indices`` [b, T]); a verify of the window ``step`` ([b, T, ...]) reads the
    state after the previous verify's accepted draft, slot ``[b, accepted[b] - 1]`` (``num_accepted_tokens``), and
    writes the state after every window token in place, so the commit is the accepted counts alone. GDN
    (``fla_gdn_mtp``) runs the same kernel with its gate repeated along K (:func:`_fla_gate`): fla-core 0.6.0's GDN
    kernel takes no state indices."""
    if impl != f"fla_{shape.family}_mtp":
        raise PeerUnavailable(f"{impl} is a {impl.split('_')[1].upper()} peer, not {shape.family}")
    if parse_state_label(state_dtype, arg="state_dtype").stored:
        raise PeerUnavailable(f"{impl} has no {state_dtype} state")
    fn = _import("fla.ops.kda.fused_recurrent").fused_recurrent_kda_fwd
    T = step.q.shape[1]
    q, k, v, b = (t.contiguous() for t in (step.q, step.k, step.v, step.b))
    g, dt_bias = _fla_gate(shape, step)
    out = torch.empty_like(v)
    pools = []
    for _ in range(n_pools):
        drafts = (1 + torch.randperm(batch * T, generator=gen)).view(batch, T).to(torch.int32).to(device)
        pools.append((random_state(batch * T + 1, shape.dims, state_dtype, gen, device), drafts))

    def call(p: int) -> Callable[[], None]:
        def run(state: torch.Tensor = pools[p][0], drafts: torch.Tensor = pools[p][1]) -> None:
            fn(q, k, v, g, b, A_log=step.A_log, dt_bias=dt_bias, initial_state=state, inplace_final_state=True,
               state_v_first=True, ssm_state_indices=drafts, num_accepted_tokens=accepted,
               use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True, use_beta_sigmoid_in_kernel=True, out=out)
        return run

    gate = "the GDN gate repeated along K" if shape.family == "gdn" else "KDA's gate"
    return PeerCase(impl, [call(p) for p in range(n_pools)], variant=f"fused_recurrent_kda_fwd, T={T} state slots "
                    f"per row", outputs=[out], notes=f"{gate}; the commit is num_accepted_tokens (no copy)")


MAMBA2_PEERS = ("flashinfer_ssu", "flashinfer_checkpointing_ssu", "mamba_ssm_ssu")
GDN_PEERS = ("fla_gdn", "fla_gdn_pooled")
KDA_PEERS = ("fla_kda",)
PEERS_BY_FAMILY: dict[str, tuple[str, ...]] = {"mamba2": MAMBA2_PEERS, "gdn": GDN_PEERS, "kda": KDA_PEERS}
# speculative verify (bench kernels --spec)
SPEC_PEERS = ("flashinfer_checkpointing_ssu", "flashinfer_ssu_mtp", "fla_gdn_mtp", "fla_kda_mtp")
STORED_STATE_PEERS = ("flashinfer_checkpointing_ssu",)  # the peers with a quantized state (FP8, shared)


def build_peer(impl: str, shape: BenchShape, batch: int, state_dtype: str, step: Mamba2Step | DeltaStep,
               n_pools: int, buffer_len: int, gen: torch.Generator, device: torch.device) -> PeerCase:
    """Build the step callables of peer `impl` or raise PeerUnavailable (also for a stored checkpoint format the
    peer has no state of: only :data:`STORED_STATE_PEERS` take one)."""
    spec = parse_state_label(state_dtype, arg="state_dtype")
    if spec.stored and impl not in STORED_STATE_PEERS:
        raise PeerUnavailable(f"{impl} has no {spec.label} state")
    if impl == "flashinfer_ssu":
        return flashinfer_ssu(shape, batch, state_dtype, step, n_pools, gen, device)
    if impl == "flashinfer_checkpointing_ssu":
        return flashinfer_checkpointing_ssu(shape, batch, state_dtype, step, n_pools, buffer_len, gen, device)
    if impl == "mamba_ssm_ssu":
        return mamba_ssm_ssu(shape, batch, state_dtype, step, n_pools, gen, device)
    if impl == "fla_gdn":
        return fla_gdn(shape, batch, state_dtype, step, n_pools, gen, device)
    if impl == "fla_kda":
        return fla_kda(shape, batch, state_dtype, step, n_pools, gen, device)
    if impl == "fla_gdn_pooled":
        return fla_gdn_pooled(shape, batch, state_dtype, step, n_pools, gen, device)
    raise ValueError(f"impl: expected one of {sum(PEERS_BY_FAMILY.values(), ())}, got {impl!r}")


def build_spec_peer(impl: str, shape: BenchShape, batch: int, state_dtype: str, step: Mamba2Step | DeltaStep,
                    accepted: torch.Tensor, max_window: int, starts: list[tuple[int, int]], n_pools: int,
                    gen: torch.Generator, device: torch.device) -> PeerCase:
    """Build the verify-step callables of speculative peer `impl` (a window ``step``, per-token fields [b, T, ...])
    or raise PeerUnavailable. ``max_window`` and ``starts`` (each row's initial ring_start, prev_num_accepted_tokens)
    are the ring peer's."""
    if impl == "flashinfer_checkpointing_ssu":
        return flashinfer_checkpointing_ssu_spec(shape, batch, state_dtype, step, accepted, max_window, starts,
                                                 n_pools, gen, device)
    if impl == "flashinfer_ssu_mtp":
        return flashinfer_ssu_mtp(shape, batch, state_dtype, step, accepted, n_pools, gen, device)
    if impl in ("fla_gdn_mtp", "fla_kda_mtp"):
        return fla_mtp(impl, shape, batch, state_dtype, step, accepted, n_pools, gen, device)
    raise ValueError(f"impl: expected one of {SPEC_PEERS}, got {impl!r}")
