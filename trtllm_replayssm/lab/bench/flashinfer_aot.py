"""Ahead-of-time build of the FlashInfer mamba JIT modules the kernel benchmark needs.

FlashInfer 0.7.x compiles each mamba module (one per dtype/shape specialisation) with nvcc + ninja on first call.
A module found at ``flashinfer/data/aot/<uri>/<uri>.so`` is loaded instead of being built, so the modules can be
compiled on a CPU-only machine (nvcc, ``FLASHINFER_CUDA_ARCH_LIST="9.0a"``) and copied there on the GPU host.

Run (flashinfer + apache-tvm-ffi + ninja importable, no GPU needed)::

    FLASHINFER_CUDA_ARCH_LIST=9.0a python -m trtllm_replayssm.lab.bench.flashinfer_aot -o /tmp/flashinfer_aot \
        --driver-stub /tmp/cuda_stub --cuda-root /usr/local/cuda --pack .whl/flashinfer_aot.tar.xz

Both ops are specialised on the token count T of a call (``nt_T`` / ``np_T`` in the module name), so the
speculative-decoding benchmark (T > 1 tokens per verify step) needs modules of its own: ``--tokens`` picks the
T values (default 1,4; T > 1 only with fp32 state) and ``--state-dtypes`` the state dtypes (fp32, bf16, fp8: the
checkpointing_ssu module of FlashInfer's FP8 state, T = 1). An fp32 checkpointing_ssu module takes about 3.5 minutes
on two cores (bf16 state about 14, FP8 1.5), selective_state_update 0.5 (T = 1) to 2 minutes; ``--tokens 1,2,4,8``
adds T = 2 and 8.

On the GPU host, extract the archive into ``<site>/flashinfer/data/aot/``.

``--driver-stub`` is for machines without the CUDA driver: FlashInfer links every module with ``-lcuda``; an empty
``libcuda.so`` whose soname is ``libcuda.so.1`` satisfies the linker, and the GPU host's driver provides the symbols
when the module is loaded.
"""
from __future__ import annotations

import argparse
import lzma
import os
import shutil
import subprocess
import sys
import tarfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from trtllm_replayssm.core.formats import get_state_format

# Benchmark dtypes: bf16 activations, fp32 dt/A/D/dt_bias ("weights"), int32 slot indices.
_INPUT_DTYPE = torch.bfloat16
_WEIGHT_DTYPE = torch.float32
_STATE_DTYPES = (torch.float32, torch.bfloat16)
# checkpointing_ssu's 8-bit state (T = 1): E4M3 codes with an fp32 decode scale per (slot, head, state row).
_SCALED_STATE_DTYPES = (torch.float8_e4m3fn,)


@dataclass(frozen=True)
class SsuModule:
    """One FlashInfer `selective_state_update` sm_90 specialisation: `tokens` = T of x (batch, T, nheads, dim);
    T = 1 is single-token decode, T > 1 the multi-token (MTP / speculative verify) call."""

    state_dtype: torch.dtype
    dim: int
    dstate: int = 128
    tokens: int = 1
    accepted_dtype: torch.dtype = torch.int64  # dtype of num_accepted_tokens (int64 when it is None)

    def spec(self):  # -> flashinfer.jit.core.JitSpec
        from flashinfer.jit.mamba.selective_state_update import gen_selective_state_update_sm90_module

        # Argument order of FlashInfer 0.7.0.post1; cu_seqlens int32 and num_accepted_tokens int64 are the
        # dtypes `selective_state_update` assumes when those tensors are None.
        return gen_selective_state_update_sm90_module(
            self.state_dtype, _INPUT_DTYPE, _WEIGHT_DTYPE, torch.float32, torch.int32, None,
            self.dim, self.dstate, self.tokens, torch.int32, self.accepted_dtype, 0,
        )


@dataclass(frozen=True)
class CheckpointingSsuModule:
    """One FlashInfer `checkpointing_ssu` specialisation: T = `tokens` new tokens per call, logical replay window
    `window` (the ring then has R = window + T rows: FlashInfer derives max_window = x_cache.size(2) - T)."""

    state_dtype: torch.dtype
    dim: int
    nheads: int
    ngroups: int
    window: int = 16
    dstate: int = 128
    tokens: int = 1

    def spec(self):  # -> flashinfer.jit.core.JitSpec
        from flashinfer.jit.mamba.checkpointing_ssu import gen_checkpointing_ssu_module

        scale_dtype = torch.float32 if self.state_dtype in _SCALED_STATE_DTYPES else None
        return gen_checkpointing_ssu_module(
            self.state_dtype, _INPUT_DTYPE, torch.float32, _WEIGHT_DTYPE, torch.float32, torch.int32, scale_dtype,
            self.dim, self.dstate, self.tokens, self.window, self.nheads // self.ngroups, self.ngroups, 0, False,
        )


DEFAULT_TOKENS: tuple[int, ...] = (1, 4)


def benchmark_modules(tokens: tuple[int, ...] = DEFAULT_TOKENS,
                      state_dtypes: tuple[torch.dtype, ...] | None = None) -> list[SsuModule | CheckpointingSsuModule]:
    """Modules for the benchmark shapes that FlashInfer 0.7.0.post1 can compile: Super-120B (H 128, P 64, G 8),
    for both ops; T = 1 with fp32 and bf16 state (and ``checkpointing_ssu`` with its FP8 state), each T > 1 in
    `tokens` (speculative verify) with fp32 state.

    Nano-4B's head_dim 80 compiles in neither (at any T): ``selective_state_update`` fails a static_assert
    (DIM_PER_CTA % ROWS_PER_PASS in the MTP-simple kernel; later 0.7.x releases fix DIMs that are not multiples of
    64) and ``checkpointing_ssu`` needs head_dim / 2 to be a multiple of 16. `state_dtypes` (None: all) keeps the
    modules of those state dtypes only.
    """
    if not tokens or any(not 1 <= t <= 16 for t in tokens):
        raise ValueError(f"tokens: expected values in 1..16 (FlashInfer's limit, T <= window), got {tokens}")
    mods: list[SsuModule | CheckpointingSsuModule] = []
    for t in sorted(set(tokens)):
        plain = _STATE_DTYPES if t == 1 else (torch.float32,)
        mods += [SsuModule(sd, 64, tokens=t) for sd in plain]
        mods += [CheckpointingSsuModule(sd, dim=64, nheads=128, ngroups=8, tokens=t) for sd in plain]
        if t == 1:
            mods += [CheckpointingSsuModule(sd, dim=64, nheads=128, ngroups=8) for sd in _SCALED_STATE_DTYPES]
    return [m for m in mods if state_dtypes is None or m.state_dtype in state_dtypes]


def driver_stub_ldflags(stub_dir: Path, cuda_root: Path) -> str:
    """Linker flags for a driver-less machine: cudart from `cuda_root`/lib64 and a symbol-less libcuda stub, linked
    with ``--no-as-needed`` so the module still records ``NEEDED libcuda.so.1`` (its driver symbols resolve there)."""
    stub = stub_dir / "libcuda.so"
    if not stub.exists():
        stub_dir.mkdir(parents=True, exist_ok=True)
        src = stub_dir / "empty.c"
        src.write_text("")
        subprocess.run(["cc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", "-o", str(stub), str(src)], check=True)
    return f"-L{cuda_root / 'lib64'} -L{stub_dir} -Wl,--no-as-needed -lcuda"


def build(out_dir: Path, modules: list[SsuModule | CheckpointingSsuModule]) -> dict[str, str]:
    """Compile each module with FlashInfer's own ninja machinery and copy ``<uri>/<uri>.so`` under `out_dir`.

    Returns ``{uri: "ok" | error text}``; a failing module does not stop the others.
    """
    if "FLASHINFER_CUDA_ARCH_LIST" not in os.environ:
        raise ValueError("FLASHINFER_CUDA_ARCH_LIST: must be set (e.g. '9.0a') when building without a GPU; got unset")
    from flashinfer.jit.core import build_jit_specs

    status: dict[str, str] = {}
    for mod in modules:
        spec = mod.spec()
        dest = out_dir / spec.name / f"{spec.name}.so"
        if dest.exists():
            status[spec.name] = "ok"
            continue
        t0 = time.time()
        try:
            build_jit_specs([spec], verbose=False, skip_prebuilt=False)
        except RuntimeError as exc:  # ninja failure: keep the tail of the compiler output
            status[spec.name] = str(exc)[-4000:]
            print(f"[aot] FAILED {spec.name} ({time.time() - t0:.0f}s)", flush=True)
            continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(spec.jit_library_path, dest)
        status[spec.name] = "ok"
        print(f"[aot] built {spec.name} ({time.time() - t0:.0f}s, {dest.stat().st_size} B)", flush=True)
    return status


def pack(out_dir: Path, archive: Path, names: list[str] | None = None) -> Path:
    """Write ``<uri>/<uri>.so`` of `out_dir` (only the modules `names` when given) into an xz tarball (level 9,
    extreme: about a third of the .so bytes, which is what the GPU call carries)."""
    sos = sorted(out_dir.glob("*/*.so"))
    if names is not None:
        sos = [so for so in sos if so.parent.name in names]
    archive.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(archive, "w:xz", preset=9 | lzma.PRESET_EXTREME) as tar:
        for so in sos:
            tar.add(so, arcname=str(so.relative_to(out_dir)))
    return archive


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--out-dir", type=Path, required=True, help="directory receiving <uri>/<uri>.so")
    parser.add_argument("--driver-stub", type=Path, default=None, help="link against an empty libcuda stub made here")
    parser.add_argument("--cuda-root", type=Path, default=Path("/usr/local/cuda"), help="CUDA toolkit (for cudart)")
    parser.add_argument("--pack", type=Path, default=None, help="also write the modules into this .tar.xz")
    parser.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)),
                        help="comma-separated tokens per call T to build (T > 1: speculative verify, fp32 state)")
    parser.add_argument("--state-dtypes", default="",
                        help="comma-separated state dtypes to build (fp32, bf16, fp8; default: all)")
    args = parser.parse_args(argv)
    if args.driver_stub is not None:
        flags = driver_stub_ldflags(args.driver_stub, args.cuda_root)
        os.environ["FLASHINFER_EXTRA_LDFLAGS"] = f"{os.environ.get('FLASHINFER_EXTRA_LDFLAGS', '')} {flags}".strip()
    tokens = tuple(int(t) for t in args.tokens.split(",") if t.strip())
    try:
        picked = tuple(get_state_format(d.strip(), "--state-dtypes").storage_dtype
                       for d in args.state_dtypes.split(",") if d.strip())
    except ValueError as exc:
        parser.error(str(exc))
    status = build(args.out_dir, benchmark_modules(tokens, picked or None))
    failed = {k: v for k, v in status.items() if v != "ok"}
    for name, err in failed.items():
        print(f"[aot] {name}:\n{err}", file=sys.stderr)
    print(f"[aot] {len(status) - len(failed)}/{len(status)} modules in {args.out_dir}")
    if args.pack is not None:
        ok = [name for name, st in status.items() if st == "ok"]
        print(f"[aot] packed {len(ok)} modules into {pack(args.out_dir, args.pack, ok)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
