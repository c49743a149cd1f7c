"""Read-only against copy HBM bandwidth (development only): the bench's copy ceiling, and torch reductions over a
4 GiB fp32 tensor timed like the bench (bench.timing.time_calls: one CUDA graph, median per call).
Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/read_bandwidth.py"""
import torch

from trtllm_replayssm.lab.bench import timing

dev = torch.device("cuda", 0)
n = 1 << 30
x = torch.randn(n, device=dev)
y = torch.empty_like(x)
out = torch.empty((), device=dev)
nbytes, m = n * 4, n // 16  # m: the replay's write share (flush rows write 1/16 of the checkpoint)

print(f"copy ceiling  {timing.copy_ceiling_gbps(dev):7.0f} GB/s (read + write)")
us = timing.time_calls([lambda: torch.sum(x, dim=0, out=out)])
print(f"sum           {nbytes / us / 1e3:7.0f} GB/s (read only), {us:.0f} us")
us = timing.time_calls([lambda: torch.amax(x, dim=0, out=out)])
print(f"amax          {nbytes / us / 1e3:7.0f} GB/s (read only), {us:.0f} us")
us = timing.time_calls([lambda: torch.sum(x, dim=0, out=out), lambda: y[:m].copy_(x[:m])]) * 2
print(f"sum+1/16 copy {(nbytes + 2 * m * 4) / us / 1e3:7.0f} GB/s")
