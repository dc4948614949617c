#!/usr/bin/env python3
"""Tatoeba English-Chinese pairs (manythings.org's Anki export `cmn.txt`) split into train/valid/test.

    python scripts/download_tatoeba.py                       # fetch cmn-eng.zip, write data/tatoeba-en-zh/
    python scripts/download_tatoeba.py --from path/cmn.txt   # a cmn.txt (or cmn-eng.zip) already on disk

`cmn.txt` is one row per pair, `English<TAB>Chinese<TAB>attribution` (CC-BY 2.0 France, tatoeba.org), sorted by
English length. There is no official split, so this one is decided by the English sentence alone: the first
8 bytes of sha256 of the sentence (spaces collapsed, lowercased) as a number modulo 1000 put it in test
(below --test-permille, default 30), valid (the next --valid-permille, default 30) or train. Every translation
of one English sentence ("Wait!" has two) lands in the same split, so no English sentence is in two splits,
and the split of a pair never depends on the other rows: a newer export keeps every old pair where it was.

Written (rows in the file's order): `{train,valid,test}.tsv`, the rows as they were, attribution kept (the
licence asks for it), which `configs/tatoeba_en_zh.yaml` reads with data.format: tsv; with --format text,
`{split}.en` and `{split}.zh` instead (the two-file layout). Every row is checked: a row without both sentences
or invalid UTF-8 stops the script with the file and line.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import sys
import urllib.request
import zipfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from transformer_cli.core.errors import UserError  # noqa: E402
from transformer_cli.core.files import write_atomic  # noqa: E402
from transformer_cli.core.text import decode_utf8  # noqa: E402
from transformer_cli.data.shards import split_columns  # noqa: E402

URL = "https://www.manythings.org/anki/cmn-eng.zip"
SPLITS = ("train", "valid", "test")


def split_of(english: str, valid_permille: int, test_permille: int) -> str:
    """The split of every pair whose English side is `english` (see the module docstring)."""
    key = " ".join(english.split()).lower().encode("utf-8")
    bucket = int.from_bytes(hashlib.sha256(key).digest()[:8], "big") % 1000
    if bucket < test_permille:
        return "test"
    return "valid" if bucket < test_permille + valid_permille else "train"


def fetch(url: str) -> bytes:
    """cmn.txt out of the zip at `url` (manythings.org answers only a browser-like User-Agent)."""
    request = urllib.request.Request(url, headers={"User-Agent": "Mozilla/5.0 (tcli download_tatoeba.py)"})
    with urllib.request.urlopen(request, timeout=60) as response:
        return from_zip(response.read(), url)


def from_zip(data: bytes, name: str) -> bytes:
    with zipfile.ZipFile(io.BytesIO(data)) as archive:
        members = [m for m in archive.namelist() if Path(m).name == "cmn.txt"]
        if not members:
            raise UserError(f"{name} holds no cmn.txt (it holds {', '.join(archive.namelist()[:5])})")
        return archive.read(members[0])


def read_source(path: Path | None, url: str) -> tuple[bytes, str]:
    if path is None:
        print(f"fetching {url}", file=sys.stderr)
        return fetch(url), url
    try:
        data = path.read_bytes()
    except OSError as e:
        raise UserError(f"--from {path}: {e.strerror or e}") from None
    return (from_zip(data, str(path)) if zipfile.is_zipfile(io.BytesIO(data)) else data), str(path)


def split_rows(
    data: bytes, name: str, valid_permille: int, test_permille: int
) -> dict[str, list[tuple[str, str, str]]]:
    """(English, Chinese, the whole row) of every pair, by split, in the file's order."""
    rows = decode_utf8(data, name)  # strict UTF-8, no NUL; a BOM at the start is dropped
    english, chinese = split_columns(rows, (0, 1), name)
    if not rows:
        raise UserError(f"{name} holds no pairs")
    out: dict[str, list[tuple[str, str, str]]] = {split: [] for split in SPLITS}
    for en, zh, row in zip(english, chinese, rows):
        out[split_of(en, valid_permille, test_permille)].append((en.strip(), zh.strip(), row))
    return out


def write(splits: dict[str, list[tuple[str, str, str]]], out: Path, fmt: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        if fmt == "tsv":
            write_atomic("".join(row + "\n" for _, _, row in rows).encode("utf-8"), out / f"{split}.tsv")
        else:
            for lang, column in (("en", 0), ("zh", 1)):
                text = "".join(r[column] + "\n" for r in rows)
                write_atomic(text.encode("utf-8"), out / f"{split}.{lang}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, help="a local cmn.txt or cmn-eng.zip (no download)")
    parser.add_argument("--url", default=URL, help=f"where to fetch the zip (default {URL})")
    parser.add_argument("--out", type=Path, default=Path("data/tatoeba-en-zh"), help="folder to write")
    parser.add_argument("--format", choices=("tsv", "text"), default="tsv", help="tsv files, or .en/.zh files")
    parser.add_argument("--valid-permille", type=int, default=30, help="share of English sentences in valid")
    parser.add_argument("--test-permille", type=int, default=30, help="share of English sentences in test")
    args = parser.parse_args(argv)
    if not (0 <= args.valid_permille and 0 <= args.test_permille and args.valid_permille + args.test_permille < 1000):
        parser.error("--valid-permille and --test-permille are 0 or more and sum to under 1000")
    try:
        data, name = read_source(args.source, args.url)
        splits = split_rows(data, name, args.valid_permille, args.test_permille)
        if not splits["valid"] or not splits["test"]:
            raise UserError(f"{name}: too few pairs for a valid and a test split; give more rows or larger shares")
        write(splits, args.out, args.format)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # the download, or writing --out
        print(f"error: {e}", file=sys.stderr)
        return 2
    total = sum(len(rows) for rows in splits.values())
    for split, rows in splits.items():
        sentences = len({en for en, _, _ in rows})
        print(f"{split}: {len(rows):,} pairs ({sentences:,} English sentences)")
    print(f"{total:,} pairs from {name} written to {args.out} ({args.format})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
