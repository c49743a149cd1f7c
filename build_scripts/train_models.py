"""Train the byte-level accuracy models on the offline corpus (build_scripts/build_corpus.py), on a GPU.

    python3 build_scripts/train_models.py --corpus corpus -o models [--models byte-nemotron,byte-qwen] [--steps N]

Writes models/<model>/{config.json,model-*.safetensors,train.json} (trtllm_replayssm/lab/train.py; seeded windows and
initialisation) and prints each model's held-out loss and perplexity last. The directories load with
``trtllm-replayssm accuracy models/<model> ...`` and ``compare``.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # deterministic cuBLAS (before CUDA starts)

import torch  # noqa: E402

from trtllm_replayssm.lab import train  # noqa: E402
from trtllm_replayssm.lab.models.config import from_preset  # noqa: E402

MODELS = ("byte-nemotron", "byte-qwen")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="directory with train.txt and heldout/*.txt")
    parser.add_argument("-o", "--out-dir", default="models")
    parser.add_argument("--models", default=",".join(MODELS), help="comma-separated presets")
    parser.add_argument("--steps", type=int, default=train.TrainSettings.steps)
    parser.add_argument("--batch", type=int, default=train.TrainSettings.batch)
    parser.add_argument("--seq-len", type=int, default=train.TrainSettings.seq_len)
    parser.add_argument("--warmup", type=int, default=train.TrainSettings.warmup, help="(capped at --steps)")
    parser.add_argument("--seed", type=int, default=train.TrainSettings.seed)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    corpus, out = Path(args.corpus), Path(args.out_dir)
    held_files = sorted((corpus / "heldout").glob("*.txt"))
    if not (corpus / "train.txt").is_file() or not held_files:
        print(f"error: --corpus: expected train.txt and heldout/*.txt in {str(corpus)!r}", file=sys.stderr)
        return 2
    names = [n for n in args.models.split(",") if n]
    existing = [n for n in names if (out / n).exists()]
    if existing:
        print(f"error: --out-dir: {', '.join(str(out / n) for n in existing)} already exist", file=sys.stderr)
        return 2
    try:
        settings = train.TrainSettings(steps=args.steps, batch=args.batch, seq_len=args.seq_len, seed=args.seed,
                                       warmup=min(args.warmup, args.steps))
    except ValueError as err:
        print(f"error: --{str(err).split(':')[0].replace('_', '-')}: {str(err).split(': ', 1)[1]}", file=sys.stderr)
        return 2
    train_tokens = train.byte_tokens(corpus / "train.txt")
    heldout = {f.stem: train.byte_tokens(f) for f in held_files}
    rows = []
    for name in names:
        model, record = train.train_model(from_preset(name), train_tokens, heldout, settings, args.device)
        train.save_trained(model, record, out / name)
        rows += [f"{name:16s} {doc:18s} loss {loss:.4f} nats/byte  ppl {record['heldout_ppl'][doc]:.3f}  "
                 f"({record['seconds']:.0f} s)" for doc, loss in record["heldout_loss"].items()]
    print("\n".join(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
