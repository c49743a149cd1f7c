"""GPU names and the SM architectures the kernels are compiled for."""
from __future__ import annotations

GPU_TARGETS: dict[str, str] = {"h100": "sm_90a", "h200": "sm_90a", "b200": "sm_100a", "b300": "sm_103a"}
SUPPORTED_ARCHS: tuple[str, ...] = ("sm_90a", "sm_100a", "sm_103a")
# Default GPU memory (GB) per target, used for memory plans when the user gives none.
GPU_MEMORY_GB: dict[str, float] = {"h100": 80.0, "h200": 141.0, "b200": 180.0, "b300": 268.0}
# Streaming multiprocessors per target (adaptive-mode threshold, memory plans).
GPU_SM_COUNT: dict[str, int] = {"h100": 132, "h200": 132, "b200": 148, "b300": 148}


def resolve_target(gpu: str) -> str:
    """Return the SM arch (e.g. ``sm_90a``) for a GPU name such as ``h100``; raise ValueError naming the choices."""
    key = gpu.strip().lower()
    if key in GPU_TARGETS:
        return GPU_TARGETS[key]
    if key in SUPPORTED_ARCHS:
        return key
    raise ValueError(f"gpu: unknown GPU {gpu!r}; expected one of {sorted(GPU_TARGETS)} "
                     f"or an arch in {list(SUPPORTED_ARCHS)}")


def arch_for_capability(major: int, minor: int) -> str:
    """SM arch string for a device's compute capability (arch-specific 'a' targets where they exist)."""
    if (major, minor) in ((9, 0), (10, 0), (10, 3)):
        return f"sm_{major}{minor}a"
    return f"sm_{major}{minor}"
