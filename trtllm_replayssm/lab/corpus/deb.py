"""One file out of a Debian package: a ``.deb`` is an ``ar`` archive whose ``data.tar.*`` member holds the files."""
from __future__ import annotations

import io
import tarfile

AR_MAGIC = b"!<arch>\n"
_HEADER = 60  # name 16, mtime 12, uid 6, gid 6, mode 8, size 10, magic 2


def ar_members(blob: bytes) -> dict[str, bytes]:
    """The members of an ``ar`` archive by name."""
    if not blob.startswith(AR_MAGIC):
        raise ValueError("deb: not an ar archive (a .deb starts with '!<arch>')")
    out: dict[str, bytes] = {}
    pos = len(AR_MAGIC)
    while pos + _HEADER <= len(blob):
        header = blob[pos:pos + _HEADER]
        if header[58:60] != b"`\n":
            raise ValueError(f"deb: bad ar member header at byte {pos}")
        name = header[:16].decode("ascii").strip().rstrip("/")
        size = int(header[48:58].decode("ascii"))
        start = pos + _HEADER
        out[name] = blob[start:start + size]
        pos = start + size + (size & 1)  # members are 2-byte aligned
    return out


def deb_file(blob: bytes, path_suffix: str) -> bytes:
    """The file of a ``.deb`` (its bytes) whose path ends with ``path_suffix``; ``data.tar`` compressed with xz, gzip
    or bzip2 (zstd needs a module outside the standard library)."""
    members = ar_members(blob)
    data = next((v for k, v in members.items() if k.startswith("data.tar")), None)
    if data is None:
        raise ValueError(f"deb: no data.tar member, found {sorted(members)}")
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:*")
    except tarfile.ReadError as err:
        raise ValueError(f"deb: cannot read its data.tar ({err}); extract the file by hand and pass it instead") \
            from None
    with archive:
        for info in archive.getmembers():
            if info.isfile() and info.name.endswith(path_suffix):
                return archive.extractfile(info).read()
    raise ValueError(f"deb: no file ending in {path_suffix!r}")
