"""Offline text corpus for accuracy runs (standard library only): Jane Austen's novels from Debian's
``r-cran-janeaustenr`` and the King James Bible from ``bible-kjv-text``, split into training text and held-out
documents, and the byte-level tokenizer (docs/benchmarks.md, accuracy on trained models)."""
from __future__ import annotations

from .build import HELD_OUT, NOVELS, TRAIN_NOVELS, austen_novels, build_corpus, kjv_text
from .tokens import VOCAB_SIZE, decode, encode

__all__ = ["HELD_OUT", "NOVELS", "TRAIN_NOVELS", "austen_novels", "build_corpus", "kjv_text", "VOCAB_SIZE", "decode",
           "encode"]
