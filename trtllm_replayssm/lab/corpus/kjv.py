"""The King James Bible of Debian's ``bible-kjv-text`` (``/usr/lib/bible.data``).

The file is the ``bible`` program's "EC02 Compressed Data File": a header (``EC02``, the title, zero padding), at
byte 0x54 the window size and the number of windows n (32-bit big-endian), then n + 1 offsets; window i is the LZW
code stream (``compress -b16``, see :mod:`.lzw`) from offset i to offset i + 1 and decodes to ``window size`` bytes
(the last one to the rest). The text is a title line, then one ``Ge1:1 In the beginning ...`` line per verse.
"""
from __future__ import annotations

import re
import struct

from .lzw import lzw_decompress

MAGIC = b"EC02"
_TABLE = 0x54
_VERSE_LABEL = re.compile(r"^[1-3]?[A-Za-z]+\d+:\d+ ", re.MULTILINE)


def ec02_decompress(blob: bytes) -> bytes:
    """The uncompressed contents of an EC02 file."""
    if not blob.startswith(MAGIC) or len(blob) < _TABLE + 8:
        raise ValueError("bible.data: expected an EC02 compressed data file")
    window, n = struct.unpack_from(">II", blob, _TABLE)
    offsets = struct.unpack_from(f">{n + 1}I", blob, _TABLE + 8)
    if list(offsets) != sorted(offsets) or offsets[-1] > len(blob):
        raise ValueError("bible.data: window offsets out of order or past the end of the file")
    parts = [lzw_decompress(blob[a:b]) for a, b in zip(offsets, offsets[1:])]
    if any(len(p) != window for p in parts[:-1]) or (parts and not 0 < len(parts[-1]) <= window):
        raise ValueError(f"bible.data: windows do not decode to {window} bytes each")
    return b"".join(parts)


def verses(text: str) -> list[str]:
    """The verses of the decoded text without their ``Book c:v`` labels (the title line dropped)."""
    lines = text.splitlines()[1:]
    return [_VERSE_LABEL.sub("", line, count=1) for line in lines if line]
