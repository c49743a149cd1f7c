"""CI gate: compile every shipped kernel module (and the stored-checkpoint modules of serving.catalog's gate specs)
with NVRTC for sm_90a, sm_100a and sm_103a.

Fails (exit 1) on any compile error, or on register spills / a stack frame in a hot kernel (read from the ptxas
resource report in the NVRTC log). Prints one line per arch with the register range.
"""
from __future__ import annotations

import sys
import time

from trtllm_replayssm.core.jit.compiler import compile_all, resource_usage
from trtllm_replayssm.lab.layers.ops import layers_configs
from trtllm_replayssm.serving.catalog import catalog_configs, stored_gate_configs
from trtllm_replayssm.core.jit.compiler import KernelCompileError
from trtllm_replayssm.core.targets import SUPPORTED_ARCHS


def main() -> int:
    configs = catalog_configs() + layers_configs() + stored_gate_configs()
    failures: list[str] = []
    for arch in SUPPORTED_ARCHS:
        start = time.time()
        try:
            compiled = compile_all(configs, arch)
        except KernelCompileError as exc:
            print(f"FAIL {arch}: {exc}")
            return 1
        regs = []
        for result in compiled:
            usage = resource_usage(result.log)
            if len(usage) != len(result.config.kernels):
                failures.append(f"{arch} {result.config.name}: no resource report for every kernel")
            for u in usage:
                regs.append(u.registers)
                if u.spill_bytes or u.stack_bytes:
                    failures.append(f"{arch} {result.config.name}:{u.kernel}: {u.spill_bytes} B spills, "
                                    f"{u.stack_bytes} B stack")
        print(f"{arch}: {len(compiled)} modules compiled in {time.time() - start:.0f}s, "
              f"registers {min(regs)}-{max(regs)}")
    for line in failures:
        print("FAIL", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
