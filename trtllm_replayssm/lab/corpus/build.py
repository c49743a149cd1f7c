"""The corpus: training text (the King James Bible and four Austen novels) and two held-out novels, each a long
single document, written as UTF-8 files with a manifest.

Sources are the Debian packages (``apt-get download r-cran-janeaustenr bible-kjv-text``) or the files inside them
(``Rdata.rdb``, ``bible.data``); nothing is fetched.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from .deb import AR_MAGIC, deb_file
from .kjv import ec02_decompress, verses
from .rdata import rdb_records, read_character_vector

# file stem -> the novel's title line (the first string of its character vector, compared case-insensitively)
NOVELS: dict[str, str] = {
    "sense_and_sensibility": "SENSE AND SENSIBILITY", "pride_and_prejudice": "PRIDE AND PREJUDICE",
    "mansfield_park": "MANSFIELD PARK", "emma": "EMMA", "northanger_abbey": "NORTHANGER ABBEY",
    "persuasion": "PERSUASION",
}
HELD_OUT: tuple[str, ...] = ("persuasion", "northanger_abbey")
TRAIN_NOVELS: tuple[str, ...] = tuple(n for n in NOVELS if n not in HELD_OUT)
AUSTEN_RDB = "janeaustenr/data/Rdata.rdb"
KJV_DATA = "/usr/lib/bible.data"


def _source(path: Path, inner: str) -> bytes:
    """The bytes of ``path``, or of the file ending in ``inner`` when ``path`` is a .deb."""
    blob = path.read_bytes()
    return deb_file(blob, inner) if blob.startswith(AR_MAGIC) else blob


def austen_novels(rdb: bytes) -> dict[str, str]:
    """The six novels of ``Rdata.rdb`` by file stem, one printed line per text line (NA lines dropped)."""
    titles = {title: stem for stem, title in NOVELS.items()}
    out: dict[str, str] = {}
    for record in rdb_records(rdb):
        lines = [s for s in read_character_vector(record) if s is not None]
        stem = titles.get(lines[0].strip().upper()) if lines else None
        if stem is None:
            raise ValueError(f"rdb: a record whose first line {lines[:1]} is none of the six novels' titles")
        out[stem] = "\n".join(lines).strip() + "\n"
    if set(out) != set(NOVELS):
        raise ValueError(f"rdb: expected the novels {sorted(NOVELS)}, found {sorted(out)}")
    return out


def kjv_text(data: bytes) -> str:
    """The Bible of ``bible.data`` as one verse per line, labels stripped."""
    return "\n".join(verses(ec02_decompress(data).decode("latin-1"))) + "\n"


def _entry(path: Path) -> dict:
    blob = path.read_bytes()
    return {"file": path.name, "bytes": len(blob), "sha256": hashlib.sha256(blob).hexdigest()}


def build_corpus(austen: str | Path, kjv: str | Path, out_dir: str | Path) -> dict:
    """Write ``train.txt`` (the Bible, then the four training novels, separated by blank lines),
    ``heldout/<novel>.txt`` for each held-out novel and ``manifest.json`` (bytes and sha256 of each file) under
    ``out_dir``; returns the manifest. ``austen``/``kjv``: the .deb or the extracted ``Rdata.rdb``/``bible.data``."""
    novels = austen_novels(_source(Path(austen), AUSTEN_RDB))
    bible = kjv_text(_source(Path(kjv), KJV_DATA))
    out = Path(out_dir)
    (out / "heldout").mkdir(parents=True, exist_ok=True)
    train = out / "train.txt"
    train.write_text("\n\n".join([bible, *(novels[n] for n in TRAIN_NOVELS)]), encoding="utf-8")
    held = []
    for name in HELD_OUT:
        path = out / "heldout" / f"{name}.txt"
        path.write_text(novels[name], encoding="utf-8")
        held.append(_entry(path))
    manifest = {"train": {**_entry(train), "documents": ["kjv", *TRAIN_NOVELS]}, "heldout": held,
                "tokens": "bytes of the UTF-8 text (vocabulary 256)"}
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return manifest
