"""GPU names and the SM architectures the kernels are compiled for."""
from __future__ import annotations

GPU_TARGETS: dict[str, str] = {"h100": "sm_90a", "h200": "sm_90a", "b200": "sm_100a", "b300": "sm_103a"}
SUPPORTED_ARCHS: tuple[str, ...] = ("sm_90a", "sm_100a", "sm_103a")
# GPU memory (GiB) per target, used for memory plans when the user gives none.
GPU_MEMORY_GIB: dict[str, float] = {"h100": 80.0, "h200": 141.0, "b200": 180.0, "b300": 268.0}
# Streaming multiprocessors per target (adaptive-mode threshold, memory plans).
GPU_SM_COUNT: dict[str, int] = {"h100": 132, "h200": 132, "b200": 148, "b300": 148}
GPU_CHOICES = f"{', '.join(sorted(GPU_TARGETS))} or an arch {', '.join(SUPPORTED_ARCHS)}"


def resolve_gpu(gpu: str) -> tuple[str, str]:
    """``(gpu, arch)`` for a GPU name (``h100``) or an SM arch (``sm_90a``: planned as the GPU of that arch with the
    least memory); ValueError naming the choices otherwise."""
    key = gpu.strip().lower()
    if key in GPU_TARGETS:
        return key, GPU_TARGETS[key]
    if key in SUPPORTED_ARCHS:
        smallest = min((g for g, a in GPU_TARGETS.items() if a == key), key=GPU_MEMORY_GIB.__getitem__)
        return smallest, key
    raise ValueError(f"gpu: unknown GPU {gpu!r}; expected {GPU_CHOICES}")


def resolve_target(gpu: str) -> str:
    """The SM arch (e.g. ``sm_90a``) for a GPU name or an arch; ValueError naming the choices otherwise."""
    return resolve_gpu(gpu)[1]


def arch_for_capability(major: int, minor: int) -> str:
    """SM arch string for a device's compute capability (arch-specific 'a' targets where they exist)."""
    if (major, minor) in ((9, 0), (10, 0), (10, 3)):
        return f"sm_{major}{minor}a"
    return f"sm_{major}{minor}"
