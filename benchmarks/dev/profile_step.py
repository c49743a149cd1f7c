"""Where a reference-decoder decode step spends its GPU time (development only).

For each MODEL and BATCH: builds the preset with random weights (bf16 activations, fp32 state), prefills a short
prompt, then profiles eager decode steps with the torch profiler: GPU time and count per step of the top kernels,
the kernel count per step, and the CUDA-graph step time for reference; then the same for the SSM ops alone (the
``compare`` probe). With several IMPLs, the kernels whose time differs most between the first two. With T > 1 a
step is a speculative verify of T tokens per row and a commit of T - 1 of them (the SSM probe likewise).
Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/profile_step.py MODEL[,MODEL] BATCH[,BATCH] [IMPL[,IMPL] [T]]
"""
import statistics
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from trtllm_replayssm.lab.models import config, decoder
from trtllm_replayssm.lab.models.runner import CapturedGraph, time_calls

models = sys.argv[1].split(",")
batches = [int(b) for b in sys.argv[2].split(",")]
impls = sys.argv[3].split(",") if len(sys.argv) > 3 else ["baseline"]
window = int(sys.argv[4]) if len(sys.argv) > 4 else 1
dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
DTYPE = torch.bfloat16 if dev.type == "cuda" else torch.float32
def kernel_times(prof, steps: int) -> dict[str, list[float]]:
    """{kernel: [GPU us per step, launches per step]} (CPU smoke test: aten ops stand in for kernels)."""
    kernels = defaultdict(lambda: [0.0, 0.0])
    for e in prof.key_averages():
        t = (e.device_time_total if dev.type == "cuda" else e.self_cpu_time_total) / steps
        if (e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0) or (
                dev.type == "cpu" and e.key.startswith("aten::")):
            kernels[e.key][0] += t
            kernels[e.key][1] += e.count / steps
    return kernels


def profiled(fn, steps: int = 3) -> dict[str, list[float]]:
    for _ in range(3):
        fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            fn()
        sync()
    return kernel_times(prof, steps)


def sync() -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize()


def show(title: str, kernels: dict[str, list[float]], top: int) -> None:
    total, count = sum(t for t, _ in kernels.values()), sum(c for _, c in kernels.values())
    print(f"{title}: {total:.0f} us GPU time, {count:.0f} kernels per step")
    for key, (t, c) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]:
        print(f"    {t:9.1f} {c:5.0f}  {key[:110]}")


for model_name in models:
    cfg = config.from_preset(model_name)
    model = decoder.HybridLM.build(cfg, DTYPE, dev)
    for batch in batches:
        tables = {}
        for impl in impls:
            state = model.allocate(batch, 96 * window, impl, spec_tokens=window)
            prompt = torch.randint(0, cfg.vocab_size, (batch, 16), device=dev)
            tok = torch.zeros(batch, dtype=torch.long, device=dev)
            drafts = torch.randint(0, cfg.vocab_size, (batch, window - 1), device=dev)
            accepted = torch.full((batch,), max(window - 1, 1), dtype=torch.long, device=dev)
            rows = torch.arange(batch, device=dev)
            with torch.no_grad():
                tok.copy_(model.prefill(prompt, state).argmax(-1))

                def step(model=model, tok=tok, state=state, drafts=drafts, accepted=accepted, rows=rows):
                    if window == 1:  # bound now: the loops delete them after use
                        logits = model.decode_step(tok, state)
                    else:
                        logits = model.verify_step(torch.cat([tok[:, None], drafts], 1), state)
                        model.commit(accepted, state)
                        logits = logits[rows, accepted - 1]
                    tok.copy_(logits.argmax(-1))
                    return logits

                kernels = profiled(step)
                graph = CapturedGraph(step) if dev.type == "cuda" else None
                graph_us = statistics.median(time_calls(graph.replay if graph else step, 20, dev))
                probe = model.ssm_probe(state, accepted=accepted if window > 1 else None)
                probe_kernels = profiled(probe)
            print(f"\n== {model_name} batch {batch} impl {impl}: graph step {graph_us:.0f} us")
            show("  step (eager, profiled)", kernels, 30)
            show("  SSM ops alone (probe)", probe_kernels, 6)
            tables[impl] = kernels
            del state, graph
            if dev.type == "cuda":
                torch.cuda.empty_cache()
        if len(impls) > 1:
            a, b = (tables[i] for i in impls[:2])
            diff = {k: b.get(k, [0, 0])[0] - a.get(k, [0, 0])[0] for k in set(a) | set(b)}
            print(f"  largest differences {impls[1]} - {impls[0]} (us per step):")
            for key, d in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:12]:
                print(f"    {d:+9.1f}  {key[:110]}")
    del model
    if dev.type == "cuda":
        torch.cuda.empty_cache()
