"""Byte-level tokens: a token is one byte of the UTF-8 text (vocabulary 256, no merges, no special tokens)."""
from __future__ import annotations

VOCAB_SIZE = 256


def encode(text: str | bytes) -> list[int]:
    """The tokens of ``text`` (a str is UTF-8 encoded first)."""
    return list(text.encode("utf-8") if isinstance(text, str) else text)


def decode(tokens: list[int]) -> str:
    """The text of ``tokens``; byte sequences that are not UTF-8 become U+FFFD."""
    if any(not 0 <= t < VOCAB_SIZE for t in tokens):
        raise ValueError(f"tokens: expected byte tokens in 0..{VOCAB_SIZE - 1}")
    return bytes(tokens).decode("utf-8", errors="replace")
