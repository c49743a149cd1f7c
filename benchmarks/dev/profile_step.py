"""Where a reference-decoder decode step spends its GPU time (development only).

For each MODEL and BATCH: builds the preset with random weights (bf16 activations, fp32 state), prefills a short
prompt, then profiles eager decode steps with the torch profiler: GPU time and count per step of the top kernels,
the kernel count per step, and the CUDA-graph step time for reference.
Run on the GPU host: PYTHONPATH=. python3 benchmarks/dev/profile_step.py MODEL[,MODEL] BATCH[,BATCH] [IMPL]
"""
import statistics
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile

from trtllm_replayssm.models import config, decoder
from trtllm_replayssm.models.runner import capture_graph, time_calls

models = sys.argv[1].split(",")
batches = [int(b) for b in sys.argv[2].split(",")]
impl = sys.argv[3] if len(sys.argv) > 3 else "baseline"
dev = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
DTYPE = torch.bfloat16 if dev.type == "cuda" else torch.float32
for model_name in models:
    cfg = config.from_preset(model_name)
    model = decoder.HybridLM.build(cfg, DTYPE, dev)
    for batch in batches:
        state = model.allocate(batch, 96, impl)
        prompt = torch.randint(0, cfg.vocab_size, (batch, 16), device=dev)
        tok = torch.zeros(batch, dtype=torch.long, device=dev)
        with torch.no_grad():
            tok.copy_(model.prefill(prompt, state).argmax(-1))

            def step():
                logits = model.decode_step(tok, state)
                tok.copy_(logits.argmax(-1))
                return logits

            for _ in range(3):
                step()
            torch.cuda.synchronize() if dev.type == "cuda" else None
            steps = 3
            with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
                for _ in range(steps):
                    step()
                torch.cuda.synchronize() if dev.type == "cuda" else None
            graph = capture_graph(step)[0] if dev.type == "cuda" else None
            graph_us = statistics.median(time_calls(graph.replay if graph else step, 20, dev))
        kernels = defaultdict(lambda: [0.0, 0])
        total = 0.0
        for e in prof.key_averages():
            t = (e.device_time_total if dev.type == "cuda" else e.self_cpu_time_total) / steps
            if (e.device_type == torch.autograd.DeviceType.CUDA and e.device_time_total > 0) or (
                    dev.type == "cpu" and e.key.startswith("aten::")):  # CPU smoke test: ops stand in for kernels
                kernels[e.key][0] += t
                kernels[e.key][1] += e.count / steps
                total += t
        n_kernels = sum(c for _, c in kernels.values())
        print(f"\n== {model_name} batch {batch} impl {impl}: graph step {graph_us:.0f} us; eager kernels "
              f"{total:.0f} us GPU time, {n_kernels:.0f} kernels per step")
        print("  top kernels (us per step, count per step):")
        for key, (t, c) in sorted(kernels.items(), key=lambda kv: -kv[1][0])[:28]:
            print(f"    {t:9.1f} {c:5.0f}  {key[:110]}")
        del state, graph
        torch.cuda.empty_cache() if dev.type == "cuda" else None
    del model
    torch.cuda.empty_cache() if dev.type == "cuda" else None
