"""Greedy generation and timing: prefill, then N decode steps (a captured CUDA graph per batch on CUDA)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .decoder import DecodeState, HybridLM


def capture_graph(fn: Callable[[], torch.Tensor | None], warmup: int = 2) -> tuple["torch.cuda.CUDAGraph", object]:
    """Warm ``fn`` up on a side stream, then capture one call in a CUDA graph; returns (graph, captured output)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


def time_calls(fn: Callable[[], object], reps: int, device: torch.device) -> list[float]:
    """Microseconds of each of ``reps`` calls: CUDA events on CUDA, wall clock on CPU."""
    if device.type == "cuda":
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) * 1e3 for start, end in events]
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e6)
    return out


@dataclass
class DecodeRun:
    """Result of :func:`greedy_decode`: ``tokens [steps+1, b]`` (row 0 from the prefill logits, row s+1 the argmax
    of decode step s), ``top [steps, b]`` (the top-1 logit of each step) and ``gaps [steps, b]`` (top-1 minus top-2),
    ``logits [steps, rows, vocab]`` of the first ``rows`` sequences, per-step microseconds."""

    tokens: torch.Tensor
    top: torch.Tensor
    gaps: torch.Tensor
    logits: torch.Tensor
    step_us: list[float]
    graphed: bool

    @property
    def median_step_us(self) -> float:
        return statistics.median(self.step_us)


@torch.no_grad()
def greedy_decode(model: HybridLM, state: DecodeState, prompt: torch.Tensor, steps: int, keep_rows: int = 4,
                  use_graph: bool | None = None, on_step: Callable[[int, int], None] | None = None) -> DecodeRun:
    """Prefill ``prompt [b, T]``, then ``steps`` greedy decode steps, each timed. On CUDA (default) the step
    (decode, argmax, feed back) is captured once in a CUDA graph before the prefill and replayed.
    ``on_step(done, steps)`` is called after each step, outside the timed region."""
    dev = model.device
    use_graph = dev.type == "cuda" if use_graph is None else use_graph
    if use_graph and dev.type != "cuda":
        raise ValueError(f"use_graph: CUDA graphs need a CUDA model, got device {dev}")
    if steps < 1:
        raise ValueError(f"steps: expected >= 1, got {steps}")
    if prompt.shape[1] + steps >= state.max_len:
        raise ValueError(f"steps: prompt ({prompt.shape[1]}) + steps ({steps}) must stay below max_len "
                         f"({state.max_len})")
    b = state.batch
    rows = min(keep_rows, b)
    tok = torch.zeros(b, dtype=torch.long, device=dev)

    def step() -> torch.Tensor:
        logits = model.decode_step(tok, state)
        tok.copy_(logits.argmax(-1))
        return logits

    run: Callable[[], object]
    if use_graph:
        graph, static_logits = capture_graph(step)  # warm-up steps mutate the state; prefill resets it
        run = graph.replay
    else:
        static_logits = None
        run = step
    tokens = torch.empty((steps + 1, b), dtype=torch.long, device=dev)
    top = torch.empty((steps, b), dtype=torch.float32, device=dev)
    gaps = torch.empty_like(top)
    kept = torch.empty((steps, rows, model.cfg.vocab_size), dtype=torch.float32, device=dev)
    tok.copy_(model.prefill(prompt.to(dev), state).argmax(-1))
    tokens[0].copy_(tok)
    step_us = []
    for s in range(steps):
        if use_graph:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            step_us.append((start, end))
            logits = static_logits
        else:
            t0 = time.perf_counter()
            logits = run()
            step_us.append((time.perf_counter() - t0) * 1e6)
        # outside the timed region
        kept[s].copy_(logits[:rows])
        top2 = logits.topk(2, dim=-1).values.float()
        top[s].copy_(top2[:, 0])
        gaps[s].copy_(top2[:, 0] - top2[:, 1])
        tokens[s + 1].copy_(tok)
        if on_step:
            on_step(s + 1, steps)
    if use_graph:
        torch.cuda.synchronize(dev)
        step_us = [a.elapsed_time(e) * 1e3 for a, e in step_us]
    return DecodeRun(tokens.cpu(), top.cpu(), gaps.cpu(), kept, step_us, use_graph)


@torch.no_grad()
def time_ssm_only(model: HybridLM, state: DecodeState, reps: int) -> list[float]:
    """Microseconds per call of a step of the SSM ops alone (all SSM layers, static inputs); a CUDA graph of them on
    CUDA, eager on CPU. Mutates ``state``'s SSM buffers."""
    probe = model.ssm_probe(state)
    if model.device.type == "cuda":
        graph, _ = capture_graph(probe)
        return time_calls(graph.replay, reps, model.device)
    probe()
    return time_calls(probe, reps, model.device)
