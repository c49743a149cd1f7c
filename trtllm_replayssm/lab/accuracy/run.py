"""Teacher-forced decode of one token sequence through a reference decoder twice, in lockstep: the reference with
an fp32 state and the baseline op, the test with ``spec`` through the replay op (prefill of ``prompt_len`` tokens,
then one decode step per token, or speculative windows of ``spec_tokens`` tokens whose drafts are the text's next
tokens, each committing a seeded number of them); every next-token distribution is compared (:mod:`.metrics`)."""
from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from trtllm_replayssm.core.formats import StateSpec
from trtllm_replayssm.lab.compare import CompareSettings, load_model
from trtllm_replayssm.core.limits import MAX_WINDOW
from trtllm_replayssm.lab.corpus import VOCAB_SIZE
from trtllm_replayssm.lab.models.runner import CapturedGraph, acceptance_pattern

from .metrics import kl_curve, segment_records, token_metrics

DEFAULT_POSITIONS: tuple[int, ...] = (4096, 32768, 131072)


@dataclass(frozen=True)
class AccuracyConfig:
    """One run: ``model`` (a preset, config.json or safetensors directory), the test ``spec``, ``tokens`` tokens of
    which the first ``prompt_len`` are prefilled, summaries at ``positions`` (those <= tokens, then ``tokens``).
    ``spec_tokens`` > 1: the test decodes in speculative windows of that many tokens (the last token and the text's
    next ones as drafts), committing a synthetic accepted count of mean ``mean_accept`` per window (rows of
    :func:`~trtllm_replayssm.lab.models.runner.acceptance_pattern`, seeded by ``seed``); a token's test distribution
    is the one of the window that committed it. ``use_graph``: each decode step (or window) a replayed CUDA graph
    (None: on CUDA models)."""

    model: str
    spec: StateSpec
    tokens: int
    prompt_len: int = 16
    buffer_len: int = 16
    replay_mode: str = "replay"
    positions: tuple[int, ...] = DEFAULT_POSITIONS
    device: str | None = None
    act_dtype: str | None = None
    seed: int = 0
    spec_tokens: int = 1
    mean_accept: float | None = None
    use_graph: bool | None = None
    report_positions: tuple[int, ...] = field(init=False)

    def __post_init__(self) -> None:
        if not 1 <= self.spec_tokens <= MAX_WINDOW:
            raise ValueError(f"spec_tokens: expected 1..{MAX_WINDOW} tokens per window, got {self.spec_tokens}")
        if self.spec_tokens > 1:
            if self.mean_accept is None or not 1.0 <= self.mean_accept <= self.spec_tokens:
                raise ValueError(f"mean_accept: expected 1 <= A <= spec_tokens = {self.spec_tokens}, got "
                                 f"{self.mean_accept}")
            if self.spec.stored:
                raise ValueError(f"spec_tokens: the speculative verify reads plain checkpoints (fp32, fp16, bf16), "
                                 f"not {self.spec.label}")
        elif self.mean_accept is not None:
            raise ValueError("mean_accept: only with spec_tokens > 1")
        if self.prompt_len < 1:
            raise ValueError(f"prompt_len: expected >= 1, got {self.prompt_len}")
        if self.tokens <= self.prompt_len:
            raise ValueError(f"tokens: expected more than prompt_len ({self.prompt_len}), got {self.tokens}")
        kept = sorted({p for p in self.positions if self.prompt_len < p < self.tokens} | {self.tokens})
        object.__setattr__(self, "report_positions", tuple(kept))

    @property
    def settings(self) -> CompareSettings:
        """What :func:`load_model` needs (device, activation dtype, seed of random weights)."""
        return CompareSettings(batches=(1,), act_dtype=self.act_dtype, device=self.device, seed=self.seed)


def read_tokens(n: int, text: str | Path | None = None, seed: int = 0) -> torch.Tensor:
    """The first ``n`` byte tokens of the file ``text``; without one, ``n`` uniform random bytes drawn from ``seed``."""
    if text is None:
        return torch.randint(0, VOCAB_SIZE, (n,), generator=torch.Generator().manual_seed(seed))
    data = Path(text).read_bytes()[:n]
    if len(data) < n:
        raise ValueError(f"tokens: {str(text)!r} holds only {len(data)} byte tokens, asked for {n}")
    return torch.tensor(list(data), dtype=torch.long)


@torch.no_grad()
def run_accuracy(configs: AccuracyConfig | Sequence[AccuracyConfig], tokens: torch.Tensor,
                 progress: Callable[[int, int], None] | None = None, overlap: bool = True) -> dict:
    """Decode ``tokens [n]`` with the fp32 baseline state once and with each config's test state (``overlap``: in
    lockstep, each pass on its own CUDA stream; else one pass after another on the current stream); returns the
    document (``records`` of ``kind: "accuracy"``, one per config and report position, and a binned ``kl_curve`` per
    config's label). The configs share what the reference pass depends on (:func:`_reference_key`); ``progress``
    gets (decode steps done, steps in all passes)."""
    configs = [configs] if isinstance(configs, AccuracyConfig) else list(configs)
    if not configs:
        raise ValueError("configs: expected at least one AccuracyConfig")
    first = configs[0]
    for c in configs[1:]:
        if _reference_key(c) != _reference_key(first):
            raise ValueError(f"configs: every config shares the reference pass (model, tokens, prompt_len, positions, "
                             f"device, act_dtype, seed); {c.spec.label} differs from {first.spec.label}")
    if tokens.numel() != first.tokens:
        raise ValueError(f"tokens: expected {first.tokens} tokens, got {tokens.numel()}")
    model, notes = load_model(first.model, first.settings)
    if model.cfg.vocab_size < VOCAB_SIZE:
        raise ValueError(f"model: byte tokens need a vocabulary of >= {VOCAB_SIZE}, got {model.cfg.vocab_size}")
    dev = model.device
    for c in configs:
        if c.use_graph and dev.type != "cuda":
            raise ValueError(f"use_graph: CUDA graphs need a CUDA model, got device {dev}")
    graphs = [dev.type == "cuda" if c.use_graph is None else c.use_graph for c in configs]
    ids = tokens.to(dev)
    p = first.prompt_len
    steps = first.tokens - p - 1
    done, total = [0], steps * (1 + len(configs))

    def tick() -> None:
        done[0] += 1
        if progress is not None:
            progress(done[0], total)

    start = time.perf_counter()
    streams = overlap and dev.type == "cuda"
    ref = _Pass(model, ids, first, "baseline", torch.float32, 1, None, graphs[0], streams)
    tests = [_Pass(model, ids, c, "replay", c.spec, c.spec_tokens, c.mean_accept, g, streams)
             for c, g in zip(configs, graphs)]
    groups = [[ref, *tests]] if streams else [[q] for q in (ref, *tests)]  # lockstep, or one after another
    for group in groups:
        while any(not q.finished for q in group):
            for q in group:
                if not q.finished:
                    for _ in range(q.advance()):
                        tick()
    if streams:
        for q in (ref, *tests):
            torch.cuda.current_stream().wait_stream(q.stream)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    seconds = time.perf_counter() - start
    records, curves = [], {}
    for c, q in zip(configs, tests):
        kl, nll_ref, nll_test, agree = (t.cpu() for t in token_metrics(ref.logits, q.logits, ids[p:]))
        T = c.spec_tokens
        label = c.spec.label + (f" spec T={T} A={c.mean_accept:g}" if T > 1 else "")
        fields = {"kind": "accuracy", "model": c.model, **c.spec.to_dict(), "label": label, "spec_tokens": T,
                  "mean_accept": c.mean_accept, "L": c.buffer_len, "replay_mode": c.replay_mode,
                  "act_dtype": str(model.dtype).removeprefix("torch.")}
        records += [{**fields, **r} for r in segment_records(kl, nll_ref, nll_test, agree, p,
                                                            list(c.report_positions))]
        curves[label] = kl_curve(kl, p)
    return {"description": __doc__.split("\n\n")[0].replace("\n", " "),
            "config": {"model": first.model, "tokens": first.tokens, "prompt_len": p, "seed": first.seed},
            "notes": notes, "environment": {"device": str(dev), "torch": torch.__version__},
            "decode_seconds": seconds, "records": records, "kl_curve": curves}


def _reference_key(config: AccuracyConfig) -> tuple:
    """What the fp32 baseline pass of ``config`` depends on."""
    return (config.model, config.tokens, config.prompt_len, config.positions, config.device, config.act_dtype,
            config.seed)




class _Pass:
    """One state's teacher-forced decode of ``ids``: prefill of the prompt, then :meth:`advance` runs one decode
    step (``window`` 1) or speculative window committing its row of the seeded acceptance pattern, on the pass's own
    CUDA stream, so that the passes of a run overlap on the GPU. ``logits [tokens - prompt_len, vocab]``: row i
    predicts ``ids[prompt_len + i]`` (for a speculative window: the distribution of the window that committed it)."""

    def __init__(self, model, ids: torch.Tensor, config: AccuracyConfig, kind: str, spec, window: int,
                 mean_accept: float | None, use_graph: bool, own_stream: bool) -> None:
        dev = model.device
        self.stream = torch.cuda.Stream(dev) if own_stream else None
        if self.stream is not None:
            self.stream.wait_stream(torch.cuda.current_stream())
        self.ids, self.p, self.T = ids, config.prompt_len, window
        self.end = config.tokens - 1  # the last position whose next token is predicted
        self.counts = (acceptance_pattern(window, mean_accept, self.end - self.p, 1, config.seed).flatten().tolist()
                       if window > 1 else [])
        self.windows = 0
        with self._on_stream():
            allocate = ({"buffer_len": config.buffer_len, "replay_mode": config.replay_mode, "spec_tokens": window}
                        if kind == "replay" else {})
            state = model.allocate(1, config.tokens + window, kind, spec, **allocate)
            self.step = _Step(model, state, window, use_graph)  # captured before the prefill, which resets the state
            first = model.prefill(ids[None, :self.p], state)
            self.logits = torch.empty((config.tokens - self.p, first.shape[-1]), dtype=first.dtype, device=dev)
            self.logits[0].copy_(first[0])
        self.q = self.p  # next position to decode

    @property
    def finished(self) -> bool:
        return self.q >= self.end

    def _on_stream(self):
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def advance(self) -> int:
        """One decode step or window; returns how many positions it committed."""
        q, T = self.q, self.T
        with self._on_stream():
            if T == 1:
                self.logits[q - self.p + 1].copy_(self.step(self.ids[q:q + 1])[0])
                a = 1
            else:
                a = min(self.counts[self.windows], self.end - q)
                window = self.ids[q:q + T]
                if window.numel() < T:  # the text's end: padded with its last token
                    window = torch.cat([window, window[-1:].expand(T - window.numel())])
                self.logits[q - self.p + 1:q - self.p + 1 + a].copy_(self.step(window, a)[0, :a])
                self.windows += 1
        self.q += a
        return a


class _Step:
    """One teacher-forced decode step (``window`` 1: ``tokens [1]`` -> logits ``[1, vocab]``) or speculative window
    with its commit (``tokens [T]``, ``accepted`` -> logits ``[1, T, vocab]``) of ``state``, eager or a CUDA graph
    over static input buffers captured at construction (its warm-up calls change ``state``: prefill after it). The
    returned logits are valid until the next call."""

    def __init__(self, model, state, window: int, use_graph: bool) -> None:
        dev = model.device
        self.tokens = torch.zeros(window, dtype=torch.long, device=dev)
        self.accepted = torch.ones(1, dtype=torch.int32, device=dev)
        if window == 1:
            def run() -> torch.Tensor:
                return model.decode_step(self.tokens, state)
        else:
            def run() -> torch.Tensor:
                logits = model.verify_step(self.tokens[None], state)
                model.commit(self.accepted, state)
                return logits
        if use_graph:
            self.run = CapturedGraph(run).replay
        else:
            self.run = run

    def __call__(self, tokens: torch.Tensor, accepted: int = 1) -> torch.Tensor:
        self.tokens.copy_(tokens)
        self.accepted.fill_(accepted)
        return self.run()


def plot_kl(docs: list[dict], path: str | Path) -> Path:
    """PNG of the binned mean KL against position, one line per state spec of ``docs``."""
    from trtllm_replayssm.lab.plotting import pyplot, save_figure

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for doc in docs:
        for label, curve in doc["kl_curve"].items():
            ax.plot(curve["position"], curve["mean_kl"], label=label)
    ax.set_xscale("log")
    ax.set_yscale("symlog", linthresh=1e-8)
    ax.set_ylim(bottom=0)  # KL is never negative
    ax.set_xlabel("token position")
    ax.set_ylabel("mean KL(fp32 baseline ‖ test), nats")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(", ".join(sorted({d["config"]["model"] for d in docs})), fontsize=10)
    return save_figure(fig, path)
