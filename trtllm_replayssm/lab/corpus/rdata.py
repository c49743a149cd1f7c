"""R lazy-load databases (``Rdata.rdb``) of character vectors: a sequence of records, each a 4-byte big-endian
length and a zlib stream of an XDR-serialised R object (R's ``serialize`` format 2 or 3).

Only what a character vector needs is read: the header, one STRSXP and its CHARSXP elements; whatever follows
the elements (attributes) is ignored.
"""
from __future__ import annotations

import struct
import zlib

STRSXP = 16
CHARSXP = 9
_LATIN1 = 1 << 2  # CHARSXP levels (flags >> 12): the string's encoding
_UTF8 = 1 << 3


def rdb_records(blob: bytes) -> list[bytes]:
    """The decompressed records of a lazy-load database, in file order."""
    out = []
    pos = 0
    while pos < len(blob):
        if pos + 4 > len(blob):
            raise ValueError(f"rdb: truncated record header at byte {pos}")
        (size,) = struct.unpack_from(">I", blob, pos)
        z = zlib.decompressobj()
        try:
            raw = z.decompress(blob[pos + 4:])
        except zlib.error as err:
            raise ValueError(f"rdb: record at byte {pos} is not a zlib stream ({err})") from None
        if not z.eof or len(raw) != size:
            raise ValueError(f"rdb: record at byte {pos}: expected {size} bytes, got {len(raw)}")
        out.append(raw)
        pos = len(blob) - len(z.unused_data)
    return out


class _Reader:
    """Big-endian 32-bit words and byte strings from ``data``."""

    def __init__(self, data: bytes, pos: int = 0) -> None:
        self.data, self.pos = data, pos

    def int(self) -> int:
        if self.pos + 4 > len(self.data):
            raise ValueError(f"xdr: truncated at byte {self.pos}")
        (value,) = struct.unpack_from(">i", self.data, self.pos)
        self.pos += 4
        return value

    def bytes(self, n: int) -> bytes:
        if self.pos + n > len(self.data):
            raise ValueError(f"xdr: truncated string at byte {self.pos}")
        out = self.data[self.pos:self.pos + n]
        self.pos += n
        return out


def read_character_vector(payload: bytes) -> list[str | None]:
    """The strings of an XDR-serialised R character vector (None for ``NA``)."""
    if not payload.startswith(b"X\n"):
        raise ValueError("xdr: expected R's XDR serialisation (starts with 'X\\n')")
    r = _Reader(payload, 2)
    version = r.int()
    if version not in (2, 3):
        raise ValueError(f"xdr: serialisation format {version} is not supported (2 or 3)")
    r.int(), r.int()  # the writing R version, the oldest R that reads it
    if version == 3:
        r.bytes(r.int())  # native encoding name
    flags = r.int()
    if flags & 0xFF != STRSXP:
        raise ValueError(f"xdr: expected a character vector (SEXP type {STRSXP}), got type {flags & 0xFF}")
    out: list[str | None] = []
    for _ in range(r.int()):
        flags = r.int()
        if flags & 0xFF != CHARSXP:
            raise ValueError(f"xdr: expected a string (SEXP type {CHARSXP}), got type {flags & 0xFF}")
        n = r.int()
        if n == -1:
            out.append(None)
            continue
        out.append(r.bytes(n).decode("latin-1" if (flags >> 12) & _LATIN1 else "utf-8"))
    return out
