"""Greedy generation and timing: prefill, then N decode steps or N speculative verify steps with synthetic
acceptance (on CUDA a step captured once in a CUDA graph per batch and replayed)."""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from .decoder import DecodeState, HybridLM


class CapturedGraph:
    """One call of ``fn`` captured in a CUDA graph: :meth:`replay` runs it again and returns the captured output
    (``out``, rewritten in place). It holds ``fn``: the graph reads and writes the tensors ``fn`` closes over by
    address, so they must live as long as the graph (freed, their memory would be handed out again)."""

    def __init__(self, fn: Callable[[], torch.Tensor | None], warmup: int = 2) -> None:
        """Warm ``fn`` up on a side stream, then capture one call on that stream. Each graph gets its own capture
        stream: torch's default one is shared by every graph, and so would be the cuBLAS workspace torch keys by
        stream, which graphs replayed concurrently would then both write."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(warmup):
                fn()
        torch.cuda.current_stream().wait_stream(side)
        self.fn = fn
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=side):
            self.out = fn()

    def replay(self) -> object:
        self.graph.replay()
        return self.out


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


class _Trace:
    """What a run keeps of each step's logits, outside the timed region: the token fed next, the top-1 logit, the
    top-1 minus top-2 gap, and the logits of the first ``rows`` sequences."""

    def __init__(self, steps: int, batch: int, rows: int, vocab: int, device: torch.device) -> None:
        self.rows = rows
        self.tokens = torch.empty((steps + 1, batch), dtype=torch.long, device=device)
        self.top = torch.empty((steps, batch), dtype=torch.float32, device=device)
        self.gaps = torch.empty_like(self.top)
        self.kept = torch.empty((steps, rows, vocab), dtype=torch.float32, device=device)

    def add(self, s: int, logits: torch.Tensor, tok: torch.Tensor) -> None:
        """Step ``s`` gave ``logits [b, vocab]`` and the next token ``tok [b]``."""
        self.kept[s].copy_(logits[:self.rows])
        top2 = logits.topk(2, dim=-1).values.float()
        self.top[s].copy_(top2[:, 0])
        self.gaps[s].copy_(top2[:, 0] - top2[:, 1])
        self.tokens[s + 1].copy_(tok)

    def run(self, step_us: list[float], graphed: bool) -> DecodeRun:
        return DecodeRun(self.tokens.cpu(), self.top.cpu(), self.gaps.cpu(), self.kept, step_us, graphed)


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
        captured = CapturedGraph(step)  # warm-up steps mutate the state; prefill resets it
        run, static_logits = captured.replay, captured.out
    else:
        static_logits = None
        run = step
    trace = _Trace(steps, b, rows, model.cfg.vocab_size, dev)
    tok.copy_(model.prefill(prompt.to(dev), state).argmax(-1))
    trace.tokens[0].copy_(tok)
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
        trace.add(s, logits, tok)  # outside the timed region
        if on_step:
            on_step(s + 1, steps)
    if use_graph:
        torch.cuda.synchronize(dev)
        step_us = [a.elapsed_time(e) * 1e3 for a, e in step_us]
    return trace.run(step_us, use_graph)


def _accepted_length(p: float, window: int) -> float:
    """Mean accepted count of a window when each draft is accepted with probability ``p`` until the first rejection
    (the bonus token counted): ``1 + p + ... + p^(T-1)``."""
    return sum(p ** k for k in range(window))


def acceptance_pattern(spec_tokens: int, mean_accept: float, windows: int, batch: int, seed: int) -> torch.Tensor:
    """Synthetic accepted counts ``[windows, batch]`` in 1 .. ``spec_tokens`` (the bonus token counted) with mean
    ``mean_accept`` (exact up to rounding the total to whole tokens), drawn from ``seed``: each draft is accepted
    with one probability p (solved for the mean) until the window's first rejection; then single counts, picked at
    random, move by one until the total is ``round(mean_accept * windows * batch)``."""
    if not 1.0 <= mean_accept <= spec_tokens:
        raise ValueError(f"mean_accept: expected 1 <= A <= T = {spec_tokens}, got {mean_accept}")
    lo, hi = 0.0, 1.0
    for _ in range(60):  # the mean length rises with p from 1 (p = 0) to T (p = 1)
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _accepted_length(mid, spec_tokens) < mean_accept else (lo, mid)
    gen = torch.Generator().manual_seed(seed)
    drafts = torch.rand(windows * batch, spec_tokens - 1, generator=gen) < lo
    counts = 1 + drafts.long().cumprod(-1).sum(-1)
    target = round(mean_accept * counts.numel())
    while (diff := target - int(counts.sum())) != 0:
        move = 1 if diff > 0 else -1
        movable = ((counts + move >= 1) & (counts + move <= spec_tokens)).nonzero().flatten()
        pick = movable[torch.randperm(movable.numel(), generator=gen)[:abs(diff)]]
        counts[pick] += move
    return counts.view(windows, batch)


@torch.no_grad()
def speculative_decode(model: HybridLM, state: DecodeState, prompt: torch.Tensor, drafts: torch.Tensor,
                       accepted: torch.Tensor, keep_rows: int = 4, use_graph: bool | None = None,
                       on_step: Callable[[int, int], None] | None = None) -> DecodeRun:
    """Prefill ``prompt [b, P]``, then one speculative verify step per window ``s``: row b's window is its last
    sampled token followed by ``drafts[s, b]`` (``[windows, b, T - 1]``), the model verifies it
    (:meth:`HybridLM.verify_step`), keeps ``accepted[s, b]`` tokens (``[windows, b]``, 1 .. T: synthetic
    acceptance, given instead of compared with the drafts; :meth:`HybridLM.commit`) and samples the bonus token
    greedily from the logits after the last accepted one. On CUDA (default) that window step is captured once in a
    CUDA graph before the prefill and replayed, each window's drafts and counts copied into its static inputs before
    the timed replay; eager, each window is timed on the wall clock. The run's tokens, top logits, gaps and kept
    logits are those of the bonus tokens."""
    windows, b, drafted = drafts.shape
    window = drafted + 1
    if tuple(accepted.shape) != (windows, b) or windows < 1:
        raise ValueError(f"accepted: expected shape [{windows}, {b}] (windows, batch) with windows >= 1, got "
                         f"{list(accepted.shape)}")
    if ((accepted < 1) | (accepted > window)).any():
        raise ValueError(f"accepted: expected counts in 1..{window}")
    if prompt.shape[1] + windows * window >= state.max_len:
        raise ValueError(f"drafts: prompt ({prompt.shape[1]}) + windows ({windows}) x {window} tokens must stay below "
                         f"max_len ({state.max_len})")
    dev = model.device
    use_graph = dev.type == "cuda" if use_graph is None else use_graph
    if use_graph and dev.type != "cuda":
        raise ValueError(f"use_graph: CUDA graphs need a CUDA model, got device {dev}")
    drafts, accepted = drafts.to(dev), accepted.to(dev)
    rows = torch.arange(b, device=dev)
    tok = torch.zeros(b, dtype=torch.long, device=dev)
    step_drafts = drafts[0].clone()
    step_accepted = accepted[0].clone()  # valid counts for the capture's warm-up windows

    def step() -> torch.Tensor:
        logits = model.verify_step(torch.cat([tok[:, None], step_drafts], 1), state)
        model.commit(step_accepted, state)
        last = logits[rows, step_accepted - 1]
        tok.copy_(last.argmax(-1))
        return last

    run: Callable[[], torch.Tensor] = step
    if use_graph:
        captured = CapturedGraph(step)  # warm-up windows mutate the state; prefill resets it
        run = captured.replay
    trace = _Trace(windows, b, min(keep_rows, b), model.cfg.vocab_size, dev)
    tok.copy_(model.prefill(prompt.to(dev), state).argmax(-1))
    trace.tokens[0].copy_(tok)
    step_us = []
    for s in range(windows):
        step_drafts.copy_(drafts[s])
        step_accepted.copy_(accepted[s])
        if use_graph:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            last = run()
            end.record()
            step_us.append((start, end))
        else:
            t0 = time.perf_counter()
            last = run()
            step_us.append((time.perf_counter() - t0) * 1e6)
        trace.add(s, last, tok)  # outside the timed region
        if on_step:
            on_step(s + 1, windows)
    if use_graph:
        torch.cuda.synchronize(dev)
        step_us = [a.elapsed_time(e) * 1e3 for a, e in step_us]
    return trace.run(step_us, use_graph)


@torch.no_grad()
def time_ssm_only(model: HybridLM, state: DecodeState, reps: int,
                  accepted: torch.Tensor | None = None) -> list[float]:
    """Microseconds per call of a step of the SSM ops alone (all SSM layers, static inputs): a CUDA graph of them on
    CUDA, eager on CPU; with ``accepted [b]`` a speculative verify + commit of every SSM layer
    (:meth:`HybridLM.ssm_probe`). Mutates ``state``'s SSM buffers."""
    probe = model.ssm_probe(state, accepted=accepted)
    if model.device.type == "cuda":
        return time_calls(CapturedGraph(probe).replay, reps, model.device)
    probe()
    return time_calls(probe, reps, model.device)
