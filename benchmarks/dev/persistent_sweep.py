import sys, json, torch, time
from trtllm_replayssm.cache import ReplayStateCache
from trtllm_replayssm.ops import mamba2 as ops
from trtllm_replayssm.ops import _launch
torch.backends.cuda.matmul.allow_tf32 = False
dev = "cuda"
def copy_ceiling():
    a = torch.empty(1 << 28, dtype=torch.float32, device=dev); b = torch.empty_like(a)
    for _ in range(3): b.copy_(a)
    torch.cuda.synchronize(); ts=[]
    for _ in range(10):
        s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
        s.record(); b.copy_(a); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); return 2*a.numel()*4/(ts[len(ts)//2]*1e-3)/1e9
def run(H,P,N,G,B,L,sdt,impl,tile=None,mode="replay",persist=None):
    ops.ROWS_PER_CTA_OVERRIDE = tile
    _launch.PERSISTENT_OVERRIDE = persist
    state_bytes = H*P*N*(4 if sdt=="fp32" else 2)
    pools = max(2, min(16, int(4*60e6/(state_bytes*(B+1))) + 1))
    caches, inputs = [], []
    gen = torch.Generator(device=dev); gen.manual_seed(0)
    A = -(1+15*torch.rand(H, device=dev)); D = torch.randn(H, device=dev); dtb = torch.rand(H, device=dev)*4-6
    for p in range(pools):
        c = ReplayStateCache.mamba2(1, B+1, H, P, N, G, buffer_len=L, state_dtype=sdt, act_dtype=torch.bfloat16, device=dev)
        c.layer(0).state.normal_()
        idx = (torch.randperm(B, device=dev)+1).to(torch.int32)
        c.layer(0).cursor[idx.long()] = (torch.arange(B, device=dev) % L).to(torch.int32)
        x = torch.randn(B,H,P,device=dev,dtype=torch.bfloat16); dt = torch.randn(B,H,device=dev,dtype=torch.bfloat16)
        Bm = torch.randn(B,G,N,device=dev,dtype=torch.bfloat16)*0.3; C = torch.randn_like(Bm); out=torch.empty_like(x)
        caches.append(c); inputs.append((idx,x,dt,Bm,C,out))
    def call(p):
        c = caches[p]; idx,x,dt,Bm,C,out = inputs[p]
        if impl=="replay":
            ops.replay_decode(c.layer(0), x, dt, A, Bm, C, D, None, dtb, True, idx, -1, out, mode=mode)
        else:
            ops.state_update(c.layer(0).state, x, dt, A, Bm, C, D, None, dtb, True, idx, -1, out)
    steps = L
    for p in range(pools): call(p)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for s in range(steps):
            for p in range(pools): call(p)
    g.replay(); torch.cuda.synchronize()
    ts=[]
    for _ in range(15):
        s=torch.cuda.Event(enable_timing=True); e=torch.cuda.Event(enable_timing=True)
        s.record(); g.replay(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e))
    ts.sort(); us = ts[7]*1e3/(steps*pools)
    ring_rec = H*P*2 + G*N*2 + H*4
    if impl=="replay" and mode=="replay":
        byts = B*(state_bytes*(1+1/L) + ring_rec*((L-1)/2 + 1))
    else:
        byts = B*2*state_bytes
    return us, byts/(us*1e-6)/1e9
ceil = copy_ceiling()
print(f"copy ceiling {ceil:.0f} GB/s")
rows=[]
batches = [int(b) for b in (sys.argv[2] if len(sys.argv) > 2 else "64,256").split(",")]
for (name,H,P,N,G) in [("nano4b",96,80,128,8),("super120b",128,64,128,8)]:
    tiles = [t for t in (16,20,32,40,64,80) if P % t == 0]
    for sdt in ["fp32","bf16"]:
        for B in batches:
            bh = run(H,P,N,G,B,16,sdt,"baseline")
            res = []
            for t in tiles:
                for cps in (2,3):
                    tb = ops.stage_bytes(16, t, N, 4 if sdt=="fp32" else 2, 2)
                    st = _launch.stages_for(tb, cps)
                    if st < 2: continue
                    r = run(H,P,N,G,B,16,sdt,"replay",t,persist=(cps,st))
                    res.append((r[0], r[1], t, cps, st))
                    rows.append((name,sdt,B,t,cps,st,r[0],r[1]))
            res.sort()
            au = run(H,P,N,G,B,16,sdt,"replay",None,mode="auto")
            top = " ".join(f"[t{t} c{c} s{st} {u:.1f}us {100*g/ceil:.0f}%]" for u,g,t,c,st in res[:4])
            print(f"{name:10s} {sdt} B={B:4d} base {bh[0]:8.1f}us ({100*bh[1]/ceil:.0f}%) | auto {au[0]:.1f} x{bh[0]/au[0]:.2f} | best x{bh[0]/res[0][0]:.2f} {top}", flush=True)
json.dump(rows, open(sys.argv[1] if len(sys.argv)>1 else "/tmp/qb.json","w"))
