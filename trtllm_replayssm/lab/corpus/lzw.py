"""Decoder of the Unix ``compress`` LZW code stream (the data after a ``.Z`` file's 3-byte header).

Codes are packed least significant bit first, 9 bits wide at the start and one bit wider each time the table fills
the current width, up to ``max_bits``; code 256 clears the table (block mode). ``compress`` writes codes in groups
of eight, so a width change or a clear skips the unused rest of the current group.
"""
from __future__ import annotations

CLEAR = 256
_FIRST_BITS = 9


def lzw_decompress(data: bytes, max_bits: int = 16) -> bytes:
    """The bytes that block-mode LZW code stream ``data`` encodes (codes at most ``max_bits`` wide)."""
    if not _FIRST_BITS <= max_bits <= 16:
        raise ValueError(f"max_bits: expected 9..16, got {max_bits}")
    table: list[bytes] = [bytes([i]) for i in range(256)] + [b""]
    out = bytearray()
    bits, pos, in_group = _FIRST_BITS, 0, 0
    end = len(data) * 8
    prev: bytes | None = None

    def skip_group() -> None:
        nonlocal pos, in_group
        pos += (-in_group % 8) * bits
        in_group = 0

    while True:
        if len(table) >= 1 << bits and bits < max_bits:
            skip_group()
            bits += 1
        if pos + bits > end:
            return bytes(out)
        word = int.from_bytes(data[pos >> 3:(pos >> 3) + 3], "little") >> (pos & 7)
        code = word & ((1 << bits) - 1)
        pos += bits
        in_group += 1
        if code == CLEAR:
            skip_group()
            bits, prev = _FIRST_BITS, None
            del table[CLEAR + 1:]
            continue
        if code < len(table):
            entry = table[code]
        elif code == len(table) and prev is not None:
            entry = prev + prev[:1]  # the code being defined by this very step
        else:
            raise ValueError(f"lzw: invalid code {code} at bit {pos - bits}")
        out += entry
        if prev is not None and len(table) < 1 << max_bits:
            table.append(prev + entry[:1])
        prev = entry
