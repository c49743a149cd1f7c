"""Corpus extraction on small synthetic samples: ar/.deb members, R lazy-load records of XDR character vectors, the
compress LZW stream in an EC02 file, the train/held-out split; the byte tokenizer's round trip."""
from __future__ import annotations

import io
import struct
import tarfile
import zlib
from pathlib import Path

import pytest

from trtllm_replayssm.lab.corpus import HELD_OUT, NOVELS, build_corpus, decode, encode, kjv_text
from trtllm_replayssm.lab.corpus.deb import deb_file
from trtllm_replayssm.lab.corpus.lzw import lzw_decompress
from trtllm_replayssm.lab.corpus.rdata import rdb_records, read_character_vector


def xdr_strings(strings: list[str | None], version: int = 3) -> bytes:
    """R's XDR serialisation of a character vector (NA for None)."""
    out = b"X\n" + struct.pack(">iii", version, 0x040201, 0x030500)
    if version == 3:
        out += struct.pack(">i", 5) + b"UTF-8"
    out += struct.pack(">ii", 16, len(strings))
    for s in strings:
        if s is None:
            out += struct.pack(">ii", 9, -1)
        else:
            raw = s.encode()
            out += struct.pack(">ii", 9 | (8 << 12), len(raw)) + raw
    return out


def rdb(payloads: list[bytes]) -> bytes:
    return b"".join(struct.pack(">I", len(p)) + zlib.compress(p) for p in payloads)


def lzw_compress(data: bytes, max_bits: int = 16) -> bytes:
    """compress(1)'s block-mode LZW code stream (no header), codes written in groups of eight."""
    table = {bytes([i]): i for i in range(256)}
    codes_and_bits: list[tuple[int, int]] = []
    bits, next_code, group, w = 9, 257, 0, b""

    def emit(code: int) -> None:
        nonlocal group
        codes_and_bits.append((code, bits))
        group += 1

    for c in data:
        wc = w + bytes([c])
        if wc in table:
            w = wc
            continue
        emit(table[w])
        if next_code < 1 << max_bits:
            table[wc] = next_code
            next_code += 1
            if next_code > 1 << bits and bits < max_bits:  # the decoder widens one entry later
                codes_and_bits.extend([(0, bits)] * (-group % 8))
                bits, group = bits + 1, 0
        w = bytes([c])
    if w:
        emit(table[w])
    value = pos = 0
    for code, n in codes_and_bits:
        value |= code << pos
        pos += n
    return value.to_bytes((pos + 7) // 8, "little")


def ec02(text: bytes, window: int) -> bytes:
    parts = [lzw_compress(text[i:i + window]) for i in range(0, len(text), window)]
    header = b"EC02Compressed Data File".ljust(0x54, b"\0") + struct.pack(">II", window, len(parts))
    offsets, pos = [], len(header) + 4 * (len(parts) + 1)
    for p in parts:
        offsets.append(pos)
        pos += len(p)
    return header + struct.pack(f">{len(parts) + 1}I", *offsets, pos) + b"".join(parts)


def deb(files: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:xz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    out = b"!<arch>\n"
    for name, data in (("debian-binary", b"2.0\n"), ("data.tar.xz", buf.getvalue())):
        out += f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{100644:<8}{len(data):<10}`\n".encode() + data
        out += b"\n" * (len(data) & 1)
    return out


BIBLE = b"Holy Bible, Authorized (King James) Version.\nGe1:1 In the beginning.\n1Jo1:2 (For the life.)\n" \
        b"Rev22:21 Amen.\n"


def test_xdr_character_vector_round_trip() -> None:
    strings = ["EMMA", "", None, "Mrs. Weston’s café", "x" * 300]
    assert read_character_vector(xdr_strings(strings)) == strings
    assert read_character_vector(xdr_strings(strings, version=2)) == strings
    with pytest.raises(ValueError, match="character vector"):
        read_character_vector(xdr_strings(["a"]).replace(struct.pack(">ii", 16, 1), struct.pack(">ii", 13, 1)))


def test_rdb_records_check_lengths() -> None:
    blob = rdb([b"one", b"second"])
    assert rdb_records(blob) == [b"one", b"second"]
    with pytest.raises(ValueError, match="expected 4 bytes"):
        rdb_records(struct.pack(">I", 4) + zlib.compress(b"abc"))


def test_lzw_decodes_a_hand_packed_stream_with_the_kwkwk_case() -> None:
    codes = [65, 66, 257, 259]  # A B AB ABA: code 259 is defined by the step that reads it
    value = sum(c << (9 * i) for i, c in enumerate(codes))
    assert lzw_decompress(value.to_bytes(5, "little")) == b"ABABABA"


def test_lzw_round_trip_across_width_changes() -> None:
    text = " ".join(f"verse {i} of {i * 7 % 13} said {i % 97}" for i in range(3000)).encode()
    packed = lzw_compress(text)
    assert len(packed) < len(text) // 2  # codes went past 9 bits: several width changes
    assert lzw_decompress(packed) == text


def test_kjv_from_ec02_windows_strips_labels() -> None:
    assert kjv_text(ec02(BIBLE, window=32)) == "In the beginning.\n(For the life.)\nAmen.\n"


def test_build_corpus_from_debs_splits_train_and_held_out(tmp_path: Path) -> None:
    novels = {stem: [title.title() if stem == "persuasion" else title, "", f"text of {stem}", None, "end"]
              for stem, title in NOVELS.items()}
    austen = tmp_path / "austen.deb"
    austen.write_bytes(deb({"./usr/lib/R/site-library/janeaustenr/data/Rdata.rdb":
                            rdb([xdr_strings(v) for v in novels.values()])}))
    kjv = tmp_path / "bible-kjv-text.deb"
    kjv.write_bytes(deb({"./usr/lib/bible.data": ec02(BIBLE, window=40)}))
    manifest = build_corpus(austen, kjv, tmp_path / "corpus")
    train = (tmp_path / "corpus" / "train.txt").read_text()
    assert train.startswith("In the beginning.\n") and "text of emma" in train
    assert "persuasion" not in train and "northanger" not in train.lower()
    for name in HELD_OUT:
        assert (tmp_path / "corpus" / "heldout" / f"{name}.txt").read_text() == \
            "\n".join(s for s in novels[name] if s is not None) + "\n"
    assert manifest["train"]["bytes"] == len(train.encode())
    assert deb_file(kjv.read_bytes(), "bible.data").startswith(b"EC02")


def test_build_corpus_rejects_an_unknown_title(tmp_path: Path) -> None:
    (tmp_path / "Rdata.rdb").write_bytes(rdb([xdr_strings(["LADY SUSAN", "text"])]))
    (tmp_path / "bible.data").write_bytes(ec02(BIBLE, window=64))
    with pytest.raises(ValueError, match="titles"):
        build_corpus(tmp_path / "Rdata.rdb", tmp_path / "bible.data", tmp_path / "out")


def test_byte_tokens_round_trip() -> None:
    text = "“Elinor,” said Marianne — Ægypt\n"
    tokens = encode(text)
    assert len(tokens) == len(text.encode()) > len(text) and max(tokens) < 256
    assert decode(tokens) == text
    assert encode(text.encode()) == tokens
    with pytest.raises(ValueError, match="byte tokens"):
        decode([256])
