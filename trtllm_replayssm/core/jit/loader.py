"""Load compiled cubins with the cuda-python driver API and launch kernels on the current torch CUDA stream.

Kernels take a single by-value parameter struct; :func:`launch` receives it as a ctypes struct (core/layouts.py),
which keeps the Python launch cost to one ctypes buffer per call and makes launches capturable in CUDA graphs.
"""
from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import torch

from trtllm_replayssm.core.jit.compiler import PLUGIN_DIR_ENV, compile_config
from trtllm_replayssm.core.jit.configs import KernelConfig
from trtllm_replayssm.core.targets import arch_for_capability


class KernelLaunchError(RuntimeError):
    """A CUDA driver call failed while loading or launching a kernel."""


_LOCK = threading.Lock()
_MODULES: dict[tuple[KernelConfig, int, str | None], tuple[object, dict[str, object]]] = {}


def _driver():
    from cuda.bindings import driver

    return driver


def _check(result, what: str):
    err, *rest = result if isinstance(result, tuple) else (result,)
    driver = _driver()
    if err != driver.CUresult.CUDA_SUCCESS:
        _, name = driver.cuGetErrorName(err)
        raise KernelLaunchError(f"{what} failed: {name.decode() if isinstance(name, bytes) else name}")
    return rest[0] if len(rest) == 1 else rest


def device_arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return arch_for_capability(major, minor)


def _ensure_context(device_index: int) -> None:
    """Make torch's primary context current on this thread (the driver API needs a current context)."""
    torch.cuda.init()
    with torch.cuda.device(device_index):
        torch.cuda.current_stream()  # forces torch to create and bind the primary context
        driver = _driver()
        ctx = _check(driver.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if int(ctx) == 0:
            dev = _check(driver.cuDeviceGet(device_index), "cuDeviceGet")
            primary = _check(driver.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _check(driver.cuCtxSetCurrent(primary), "cuCtxSetCurrent")


def load_cubin(path: Path, names: tuple[str, ...]) -> tuple[object, dict[str, object]]:
    """Load a cubin into the current context; return (module, {kernel name: CUfunction})."""
    driver = _driver()
    module = _check(driver.cuModuleLoadData(path.read_bytes()), f"cuModuleLoadData({path.name})")
    functions = {name: _check(driver.cuModuleGetFunction(module, name.encode()), f"cuModuleGetFunction({name})")
                 for name in names}
    return module, functions


def get_kernel(config: KernelConfig, name: str, device: torch.device):
    """The CUfunction ``name`` of ``config`` on ``device``; compiles (cached on disk) and loads on first use."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (config, index, os.environ.get(PLUGIN_DIR_ENV))  # a development source override loads its own modules
    entry = _MODULES.get(key)
    if entry is None:
        with _LOCK:
            entry = _MODULES.get(key)
            if entry is None:
                _ensure_context(index)
                compiled = compile_config(config, device_arch(torch.device("cuda", index)))
                with torch.cuda.device(index):
                    entry = load_cubin(compiled.cubin_path, config.kernels)
                _MODULES[key] = entry
    return entry[1][name]


_MAX_SHARED_CARVEOUT: set[int] = set()


def prefer_max_shared(function) -> None:
    """Ask for the whole L1 as shared memory for ``function`` (once): the persistent kernels' carveout, also asked for
    by a kernel launched just before one of them, so an SM need not drain to change its carveout between the two."""
    key = int(function)
    if key in _MAX_SHARED_CARVEOUT:
        return
    driver = _driver()
    carveout = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT
    _check(driver.cuFuncSetAttribute(function, carveout, 100), "cuFuncSetAttribute(PREFERRED_SHARED_MEMORY_CARVEOUT)")
    _MAX_SHARED_CARVEOUT.add(key)


_DYNAMIC_SHARED: dict[int, int] = {}


def allow_dynamic_shared(function, nbytes: int) -> None:
    """Let ``function`` take ``nbytes`` of dynamic shared memory (above the 48 KiB default); once per size."""
    key = int(function)
    if _DYNAMIC_SHARED.get(key, 0) >= nbytes:
        return
    driver = _driver()
    attr = driver.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES
    _check(driver.cuFuncSetAttribute(function, attr, nbytes), "cuFuncSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
    # All of L1 as shared memory, or the driver may pick a carveout that fits fewer CTAs per SM than planned.
    prefer_max_shared(function)
    _DYNAMIC_SHARED[key] = nbytes


def launch(function, grid: tuple[int, int, int], block: tuple[int, int, int], params: ctypes.Structure,
           stream: torch.cuda.Stream | None = None, shared_bytes: int = 0, programmatic: bool = False) -> None:
    """Launch ``function`` with one by-value struct parameter on ``stream`` (default: torch's current stream).

    ``programmatic``: programmatic dependent launch: the kernel may start while the previous kernel on the stream
    still runs; it must execute ``griddepcontrol.wait`` before reading that kernel's results.
    """
    driver = _driver()
    stream = stream if stream is not None else torch.cuda.current_stream()
    args = (ctypes.c_void_p * 1)(ctypes.addressof(params))  # kernelParams[0] -> the struct bytes
    if not programmatic:
        _check(driver.cuLaunchKernel(function, grid[0], grid[1], grid[2], block[0], block[1], block[2], shared_bytes,
                                     stream.cuda_stream, ctypes.addressof(args), 0), "cuLaunchKernel")
        return
    config = driver.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = grid
    config.blockDimX, config.blockDimY, config.blockDimZ = block
    config.sharedMemBytes = shared_bytes
    config.hStream = stream.cuda_stream
    config.attrs = [_programmatic_attr()]
    config.numAttrs = 1
    _check(driver.cuLaunchKernelEx(config, function, ctypes.addressof(args), 0), "cuLaunchKernelEx")


def _programmatic_attr():
    driver = _driver()
    attr = driver.CUlaunchAttribute()
    attr.id = driver.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
    attr.value.programmaticStreamSerializationAllowed = 1
    return attr
