"""Read-only against copy HBM bandwidth (development only; session 10 call 11): torch reductions and copy_ over a
4 GiB fp32 tensor, CUDA events, medians of 20. Run on the GPU host: python3 benchmarks/dev/read_bandwidth.py"""
import statistics

import torch

dev = torch.device("cuda")
n = 1 << 30
x = torch.randn(n, device=dev)
y = torch.empty_like(x)
out = torch.empty((), device=dev)
nbytes = n * 4


def median_s(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        torch.cuda.synchronize()
        times.append(a.elapsed_time(b) * 1e-3)
    return statistics.median(times)


t = median_s(lambda: y.copy_(x))
print(f"copy_         {2 * nbytes / t / 1e9:7.0f} GB/s (read + write), {t * 1e6:.0f} us")
t = median_s(lambda: torch.sum(x, dim=0, out=out))
print(f"sum           {nbytes / t / 1e9:7.0f} GB/s (read only), {t * 1e6:.0f} us")
t = median_s(lambda: torch.amax(x, dim=0, out=out))
print(f"amax          {nbytes / t / 1e9:7.0f} GB/s (read only), {t * 1e6:.0f} us")
m = n // 16  # the replay's mix: every read, 1/16 written back (flush rows)
t = median_s(lambda: (torch.sum(x, dim=0, out=out), y[:m].copy_(x[:m])))
print(f"sum+1/16 copy {(nbytes + 2 * m * 4) / t / 1e9:7.0f} GB/s")
