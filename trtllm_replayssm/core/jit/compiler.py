"""Compile plugin sources to cubins with NVRTC (cuda-python); cache them on disk.

The cache key hashes the source files (the kernel file and every header it includes from ``plugins/``), the target
arch, the NVRTC version and the options, so a changed source never loads a stale cubin.
"""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from trtllm_replayssm.core.jit.configs import KernelConfig
from trtllm_replayssm.core.layouts import common_checks

PLUGIN_DIR = Path(__file__).resolve().parents[3] / "plugins"
_PACKAGED_PLUGIN_DIR = Path(__file__).resolve().parents[2] / "_plugins"  # wheel installs copy plugins/ here


class KernelCompileError(RuntimeError):
    """NVRTC rejected a kernel source; the message holds the compile log."""


@dataclass(frozen=True)
class CompiledKernel:
    """A compiled cubin on disk and the NVRTC log of its compilation."""

    config: KernelConfig
    arch: str
    cubin_path: Path
    log: str


PLUGIN_DIR_ENV = "TRTLLM_REPLAYSSM_PLUGIN_DIR"  # development: compile kernel sources from another directory


def plugin_dir() -> Path:
    """Directory holding the CUDA sources: $TRTLLM_REPLAYSSM_PLUGIN_DIR (for A/B runs of kernel variants), else the
    repo's ``plugins/``, else the packaged copy."""
    override = os.environ.get(PLUGIN_DIR_ENV)
    candidates = (Path(override),) if override else (PLUGIN_DIR, _PACKAGED_PLUGIN_DIR)
    for candidate in candidates:
        if (candidate / "replayssm_common.cuh").is_file():
            return candidate
    raise FileNotFoundError(f"CUDA sources not found in {', '.join(map(str, candidates))}")


def cache_dir() -> Path:
    """Root of the cubin cache (``$TRTLLM_REPLAYSSM_CACHE`` or ``~/.cache/trtllm_replayssm``)."""
    root = os.environ.get("TRTLLM_REPLAYSSM_CACHE")
    return Path(root) if root else Path.home() / ".cache" / "trtllm_replayssm"


def _source_closure(source: Path) -> list[Path]:
    """The source file plus every local header it includes (transitively), in a stable order."""
    seen: dict[Path, None] = {}
    stack = [source]
    while stack:
        path = stack.pop()
        if path in seen:
            continue
        seen[path] = None
        for match in re.finditer(r'^\s*#\s*include\s+"([^"]+)"', path.read_text(), re.MULTILINE):
            header = path.parent / match.group(1)
            if header.is_file():
                stack.append(header)
    return sorted(seen)


def _nvrtc():
    from cuda.bindings import nvrtc

    return nvrtc


def nvrtc_version() -> tuple[int, int]:
    err, major, minor = _nvrtc().nvrtcVersion()
    _check(err, "nvrtcVersion")
    return int(major), int(minor)


def _check(err, what: str) -> None:
    nvrtc = _nvrtc()
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise KernelCompileError(f"{what} failed: {err}")


def _cuda_include_dir() -> str:
    """Directory with cuda_fp16.h / cuda_bf16.h (from the nvidia-cuda-runtime wheel, else a CUDA toolkit)."""
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            return str(found)
    except ImportError:
        pass
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and Path(root, "include", "cuda_fp16.h").is_file():
            return str(Path(root, "include"))
    raise KernelCompileError("CUDA headers not found: install nvidia-cuda-runtime (pip) or set CUDA_HOME")


def compile_options(config: KernelConfig, arch: str) -> list[str]:
    """NVRTC options for one kernel config (defines, arch, optimisation flags)."""
    opts = [f"--gpu-architecture={arch}", "-std=c++17", "--use_fast_math", "-default-device", "-lineinfo",
            "--fmad=true", "-Xptxas=-warn-spills", "-Xptxas=-v"]
    opts += [f"-D{key}={value}" for key, value in sorted(config.defines.items())]
    return opts


def cache_key(config: KernelConfig, arch: str) -> str:
    """Hash of source closure + arch + options + NVRTC version."""
    digest = hashlib.sha256()
    source = plugin_dir() / config.source
    for path in _source_closure(source):
        digest.update(path.name.encode())
        digest.update(path.read_bytes())
    digest.update(program_source(config))
    for name, text in program_headers(config).items():
        digest.update(name + text)
    digest.update(arch.encode())
    digest.update("\0".join(compile_options(config, arch)).encode())
    digest.update(repr(nvrtc_version()).encode())
    return digest.hexdigest()[:24]


def program_source(config: KernelConfig) -> bytes:
    """The text NVRTC compiles: the plugin source, then the config's checks and the shared limits' checks (after the
    source, so line numbers of the kernel code stay those of the file)."""
    checks = "\n".join(c for c in (common_checks(), config.appended_source()) if c)
    return (plugin_dir() / config.source).read_bytes() + f"\n// checks from trtllm_replayssm/core/layouts.py\n{checks}\n".encode()


def program_headers(config: KernelConfig) -> dict[bytes, bytes]:
    """The in-memory headers of a compilation: each parameter struct of ``config.layouts`` as ``<Name>.h``."""
    return {layout.header_name.encode(): layout.header().encode() for layout in config.layouts}


def compile_config(config: KernelConfig, arch: str, *, force: bool = False) -> CompiledKernel:
    """Compile ``config`` for ``arch`` (e.g. ``sm_90a``) unless a cached cubin exists; return its path and log."""
    key = cache_key(config, arch)
    out_dir = cache_dir() / arch
    cubin_path = out_dir / f"{config.name}-{key}.cubin"
    log_path = cubin_path.with_suffix(".log")
    if cubin_path.is_file() and not force:
        return CompiledKernel(config, arch, cubin_path, log_path.read_text() if log_path.is_file() else "")

    cubin, log = _nvrtc_compile(config, arch, compile_options(config, arch), "CUBIN")

    out_dir.mkdir(parents=True, exist_ok=True)
    # Atomic write: concurrent processes may compile the same config.
    with tempfile.NamedTemporaryFile(dir=out_dir, delete=False) as tmp:
        tmp.write(cubin)
    os.replace(tmp.name, cubin_path)
    log_path.write_text(log)
    return CompiledKernel(config, arch, cubin_path, log)


def compile_ptx(config: KernelConfig, arch: str) -> str:
    """The PTX NVRTC generates for ``config`` on ``arch`` (e.g. ``sm_90a``), not cached: for checks of the code the
    front end emits (the vector width of loads and stores) before ptxas."""
    virtual = arch.replace("sm_", "compute_")
    opts = [o.replace(arch, virtual) for o in compile_options(config, arch) if not o.startswith("-Xptxas")]
    return _nvrtc_compile(config, arch, opts, "PTX")[0].rstrip(b"\x00").decode()


def _nvrtc_compile(config: KernelConfig, arch: str, options: list[str], output: str) -> tuple[bytes, str]:
    """Compile ``config`` for ``arch`` with NVRTC ``options``; return the ``output`` ("CUBIN" or "PTX") and the log."""
    nvrtc = _nvrtc()
    source = plugin_dir() / config.source
    headers = program_headers(config)
    err, prog = nvrtc.nvrtcCreateProgram(program_source(config), str(source).encode(), len(headers),
                                         list(headers.values()), list(headers))
    _check(err, "nvrtcCreateProgram")
    try:
        opts = options + [f"-I{plugin_dir()}", f"-I{_cuda_include_dir()}"]
        (result,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * size
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\x00").decode(errors="replace").strip()
        if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise KernelCompileError(f"{config.name} for {arch}: NVRTC compilation failed:\n{log}")
        err, size = getattr(nvrtc, f"nvrtcGet{output}Size")(prog)
        _check(err, f"nvrtcGet{output}Size")
        out = b" " * size
        (err,) = getattr(nvrtc, f"nvrtcGet{output}")(prog, out)
        _check(err, f"nvrtcGet{output}")
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
    return out, log


@dataclass(frozen=True)
class ResourceUsage:
    """Per-kernel numbers ptxas printed into the NVRTC log."""

    kernel: str
    registers: int
    spill_bytes: int
    stack_bytes: int


def resource_usage(log: str) -> list[ResourceUsage]:
    """Parse ``-Xptxas -v`` output: registers, spill stores+loads and stack frame per entry function."""
    usage, current, stack, spills = [], None, 0, 0
    for line in log.splitlines():
        if m := re.search(r"Function properties for (\w+)", line):
            current = m.group(1)
        elif m := re.search(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads", line):
            stack, spills = int(m.group(1)), int(m.group(2)) + int(m.group(3))
        elif (m := re.search(r"Used (\d+) registers", line)) and current:
            usage.append(ResourceUsage(current, int(m.group(1)), spills, stack))
            current = None
    return usage


def compile_all(configs: list[KernelConfig], arch: str, out_dir: Path | None = None,
                progress: Callable[[KernelConfig], None] | None = None,
                workers: int | None = None) -> list[CompiledKernel]:
    """Compile (or take from the cache) every config for ``arch`` on ``workers`` threads (default: one per CPU;
    NVRTC releases the GIL); copy cubins to ``out_dir`` as ``<name>.<arch>.cubin`` if given. Results keep the
    order of ``configs``; ``progress`` is called once per finished config."""
    def one(cfg: KernelConfig) -> CompiledKernel:
        result = compile_config(cfg, arch)
        if out_dir is not None:
            out_dir.mkdir(parents=True, exist_ok=True)
            shutil.copy2(result.cubin_path, out_dir / f"{cfg.name}.{arch}.cubin")
        return result

    with ThreadPoolExecutor(max_workers=workers or os.cpu_count() or 1) as pool:
        futures = [pool.submit(one, cfg) for cfg in configs]
        try:
            for future in as_completed(futures):
                future.result()
                if progress:
                    progress(future.result().config)
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return [f.result() for f in futures]
