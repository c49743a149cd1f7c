"""Training of the byte-level accuracy models: next-byte cross-entropy on the corpus's training text through
:meth:`HybridLM.logits` (the decoder's own prefill path, differentiable), seeded windows, AdamW with a linear warmup
and cosine decay, float32 parameters and activations (TF32 matmuls on CUDA). :func:`save_trained` writes a directory
the decoders load (``config.json``, bf16 safetensors shards small enough to come back from the GPU machine) with
``train.json`` (settings, loss curve, held-out loss and perplexity).

The SSM layers train through the chunked forms of the decoders' float32 scans (``mamba2_chunk_scan``,
``gdn_chunk_scan``: the same recurrence, a few launches per chunk of tokens instead of per token).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from trtllm_replayssm.lab.corpus.tokens import VOCAB_SIZE
from trtllm_replayssm.lab.models.config import HybridConfig, to_hf_config
from trtllm_replayssm.lab.models.decoder import HybridLM
from trtllm_replayssm.lab.models.mixers import FP32_PARAMS


@dataclass(frozen=True)
class TrainSettings:
    """What a training run does: ``steps`` optimizer steps of ``batch`` windows of ``seq_len + 1`` tokens drawn
    uniformly from the training text with ``seed``; peak learning rate ``lr`` after ``warmup`` steps, cosine decay to
    a tenth; held-out loss over the first ``eval_tokens`` tokens of each held-out document; the SSM layers' scans in
    chunks of ``chunk`` tokens."""

    steps: int = 1500
    batch: int = 32
    seq_len: int = 256
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    seed: int = 0
    eval_tokens: int = 65536
    log_every: int = 50
    chunk: int = 64

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "seq_len", "eval_tokens", "log_every", "chunk"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        if not 0 <= self.warmup <= self.steps:
            raise ValueError(f"warmup: expected 0..steps={self.steps}, got {self.warmup}")


def byte_tokens(path: str | Path) -> torch.Tensor:
    """The byte tokens of a UTF-8 text file (int64)."""
    return torch.frombuffer(bytearray(Path(path).read_bytes()), dtype=torch.uint8).long()


def learning_rate(step: int, s: TrainSettings) -> float:
    """Linear warmup to ``s.lr``, then cosine decay to ``s.lr / 10`` at the last step."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    frac = (step - s.warmup) / max(1, s.steps - 1 - s.warmup)
    return s.lr * (0.1 + 0.45 * (1.0 + math.cos(math.pi * frac)))


def _loss(model: HybridLM, windows: torch.Tensor, chunk: int) -> torch.Tensor:
    logits = model.logits(windows[:, :-1], chunk)
    return F.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))


@torch.no_grad()
def heldout_loss(model: HybridLM, tokens: torch.Tensor, s: TrainSettings) -> float:
    """Mean next-byte cross-entropy (nats) over consecutive windows of the first ``s.eval_tokens`` tokens (each
    window from an empty state: a short-context loss, comparable across checkpoints)."""
    n = min(s.eval_tokens, tokens.numel() - 1) // s.seq_len * s.seq_len
    if n == 0:
        raise ValueError(f"tokens: a held-out document needs more than seq_len={s.seq_len} tokens")
    windows = tokens[:n + 1].unfold(0, s.seq_len + 1, s.seq_len).to(model.device)
    total = sum(_loss(model, windows[i:i + s.batch], s.chunk).item() * windows[i:i + s.batch].shape[0]
                for i in range(0, windows.shape[0], s.batch))
    return total / windows.shape[0]


def train_model(cfg: HybridConfig, train_tokens: torch.Tensor, heldout: dict[str, torch.Tensor], s: TrainSettings,
                device: str | torch.device, log: Callable[[str], None] = print) -> tuple[HybridLM, dict]:
    """Train a decoder of ``cfg`` (byte vocabulary) from its seeded random initialisation; returns the model and a
    record (settings, loss every ``log_every`` steps, held-out loss and perplexity per document, seconds)."""
    if cfg.vocab_size < VOCAB_SIZE:
        raise ValueError(f"cfg: byte tokens need a vocabulary of at least {VOCAB_SIZE}, got {cfg.vocab_size}")
    if train_tokens.numel() <= s.seq_len + 1:
        raise ValueError(f"train_tokens: expected more than seq_len + 1 = {s.seq_len + 1} tokens")
    dev = torch.device(device)
    with _training_numerics():
        return _train(cfg, train_tokens, heldout, s, dev, log)


@contextlib.contextmanager
def _training_numerics():
    """While training: TF32 for float32 matmuls on CUDA, torch's deterministic algorithms where they exist (a
    warning where an op has none; cuBLAS needs CUBLAS_WORKSPACE_CONFIG set before CUDA starts, as
    build_scripts/train_models.py does) and the math attention backend (the fused ones' backward passes are not
    deterministic); torch's settings restored after."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    tf32, det = torch.backends.cuda.matmul.allow_tf32, torch.are_deterministic_algorithms_enabled()
    warn = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        torch.backends.cuda.matmul.allow_tf32 = tf32
        torch.use_deterministic_algorithms(det, warn_only=warn)


def _train(cfg: HybridConfig, train_tokens: torch.Tensor, heldout: dict[str, torch.Tensor], s: TrainSettings,
           dev: torch.device, log: Callable[[str], None]) -> tuple[HybridLM, dict]:
    model = HybridLM.build(cfg, torch.float32, dev, seed=s.seed)
    model.train()
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": s.weight_decay},
                             {"params": no_decay, "weight_decay": 0.0}], lr=s.lr, betas=(0.9, 0.95))
    gen = torch.Generator().manual_seed(s.seed)
    curve, start = [], time.time()
    for step in range(s.steps):
        starts = torch.randint(0, train_tokens.numel() - s.seq_len - 1, (s.batch,), generator=gen)
        windows = torch.stack([train_tokens[i:i + s.seq_len + 1] for i in starts.tolist()]).to(dev)
        for group in opt.param_groups:
            group["lr"] = learning_rate(step, s)
        loss = _loss(model, windows, s.chunk)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        if step % s.log_every == 0 or step == s.steps - 1:
            curve.append({"step": step, "loss": loss.item(), "seconds": time.time() - start})
            log(f"{cfg.name} step {step}/{s.steps}: loss {curve[-1]['loss']:.4f} ({curve[-1]['seconds']:.0f} s)")
    model.eval()
    held = {name: heldout_loss(model, toks, s) for name, toks in heldout.items()}
    record = {"model": cfg.name, "settings": asdict(s), "parameters": sum(p.numel() for p in model.parameters()),
              "device": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", "curve": curve,
              "heldout_loss": held, "heldout_ppl": {k: math.exp(v) for k, v in held.items()},
              "seconds": time.time() - start, "weights_sha256": weights_digest(model)}
    return model, record


def weights_digest(model: torch.nn.Module) -> str:
    """SHA-256 over the parameters' names and float32 bytes in order: equal digests, bit-identical training."""
    digest = hashlib.sha256()
    for name, p in model.named_parameters():
        digest.update(name.encode())
        digest.update(p.detach().float().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


SHARD_BYTES = 15 << 20  # safetensors shards small enough to travel back from the GPU machine one by one


def save_trained(model: HybridLM, record: dict, out_dir: str | Path, dtype: torch.dtype = torch.bfloat16,
                 shard_bytes: int = SHARD_BYTES) -> Path:
    """``config.json`` (:func:`to_hf_config`), the parameters in ``dtype`` (``A_log``, ``D``, ``dt_bias`` in float32,
    as the decoders keep them) as ``model-0000k-of-0000n.safetensors`` shards of at most ``shard_bytes`` (a single
    parameter larger than that gets its own shard) and ``train.json`` under ``out_dir`` (which must not exist),
    written to a temporary directory first and renamed into place."""
    from safetensors.torch import save_file

    out = Path(out_dir)
    if out.exists():
        raise FileExistsError(f"out_dir: {str(out)!r} already exists")
    tmp = out.with_name(out.name + ".partial")
    if tmp.exists():  # left by an interrupted save
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    (tmp / "config.json").write_text(json.dumps(to_hf_config(model.cfg), indent=2) + "\n")
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, p in model.named_parameters():
        keep = torch.float32 if name.rsplit(".", 1)[-1] in FP32_PARAMS else dtype
        t = p.detach().to(keep).contiguous().clone().cpu()
        if shards[-1] and size + t.nbytes > shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += t.nbytes
    for k, shard in enumerate(shards):
        save_file(shard, str(tmp / f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors"))
    (tmp / "train.json").write_text(json.dumps(record, indent=2) + "\n")
    tmp.rename(out)
    return out
