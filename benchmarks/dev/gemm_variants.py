"""Decode-step GEMM shapes of a preset (development only): cuBLAS time of ``F.linear(x, W)`` vs ``x @ W^T`` with a
pre-transposed weight, batch rows M, bf16, CUDA events over a graph of repeated calls, median of 15.
Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/gemm_variants.py M K:N [K:N ...]"""
import statistics
import sys

import torch
import torch.nn.functional as F

from trtllm_replayssm.lab.models.runner import CapturedGraph, time_calls

dev = torch.device("cuda", 0)
m = int(sys.argv[1])
for shape in sys.argv[2:]:
    k, n = (int(v) for v in shape.split(":"))
    x = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=dev, dtype=torch.bfloat16) * k ** -0.5
    wt = w.t().contiguous()
    for name, fn in (("F.linear(x, W)", lambda: F.linear(x, w)), ("x @ Wt (K-major weight)", lambda: x @ wt)):
        graph = CapturedGraph(lambda: [fn() for _ in range(20)])
        us = statistics.median(time_calls(graph.replay, 15, dev)) / 20
        print(f"M={m} K={k} N={n} {name:26s} {us:7.1f} us  {2 * m * k * n / us / 1e6:6.0f} TFLOPS", flush=True)
