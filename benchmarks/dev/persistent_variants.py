# Variants (RSSM_EXP_* compile flags) exist in the kernel of commit 76b2364 only; with a later kernel only "full" is meaningful.
"""Variants of the persistent Mamba-2 main kernel: stream-only consumers, no ring terms, full."""
import sys, torch
sys.argv = [sys.argv[0], "/tmp/x.json", "256"]
exec(open("benchmarks/dev/persistent_sweep.py").read().split("ceil = copy_ceiling()")[0])
from trtllm_replayssm.kernels import configs as kc
from trtllm_replayssm.ops import mamba2 as m2
orig = kc.mamba2_config
ceil = copy_ceiling(); print(f"copy ceiling {ceil:.0f}")
for variant in [None, "RSSM_EXP_MAIN_NOOP", "RSSM_EXP_STREAM_ONLY", "RSSM_EXP_PREP_NOOP", "RSSM_EXP_NO_FLUSH"]:
    def cfg(*a, **k):
        c = orig(*a, **k)
        if variant is None: return c
        return kc.KernelConfig(c.family, c.source, c.kernels, c.params + ((variant.lower(), 1),))
    m2.mamba2_config = cfg
    for (name,H,P,N,G,t) in [("super120b",128,64,128,8,64),("nano4b",96,80,128,8,40)]:
        for sdt in ["fp32","bf16"]:
            out = []
            for cps in (3,):
                tb = ops.stage_bytes(16, t, N, 4 if sdt=="fp32" else 2, 2)
                st = _launch.stages_for(tb, cps)
                r = run(H,P,N,G,256,16,sdt,"replay",t,persist=(cps,st))
                out.append(f"c{cps}s{st} {r[0]:.1f}us {100*r[1]/ceil:.0f}%")
            print(f"{variant or 'full':22s} {name} {sdt} t{t}: " + " | ".join(out), flush=True)
