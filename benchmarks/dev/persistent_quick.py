"""Quick check of the persistent Mamba-2 replay at batch 256 (Super-120B, Nano-4B; fp32 and bf16 state): our baseline vs
replay, same protocol as persistent_sweep.py (cold-L2 pools, CUDA graph over 16-step cycles, staggered cursors, medians,
copy ceiling in the same process). Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/persistent_quick.py"""
import sys
sys.argv = [sys.argv[0], "/tmp/x.json", "256"]
exec(open("benchmarks/dev/persistent_sweep.py").read().split("ceil = copy_ceiling()")[0])
ceil = copy_ceiling(); print(f"copy ceiling {ceil:.0f}", flush=True)
for (name,H,P,N,G) in [("super120b",128,64,128,8),("nano4b",96,80,128,8)]:
    for sdt in ["fp32","bf16"]:
        bh = run(H,P,N,G,256,16,sdt,"baseline")
        au = run(H,P,N,G,256,16,sdt,"replay",None,mode="replay")
        print(f"{name} {sdt} b=256 base {bh[0]:.1f}us replay {au[0]:.1f}us ({100*au[1]/ceil:.0f}%) x{bh[0]/au[0]:.2f}", flush=True)
