"""Reading user text: strict UTF-8, and errors that name the file and the line."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from pathlib import Path

from transformer_cli.errors import UserError


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, without line endings. Invalid UTF-8 names file and line."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise read_error(e, path) from None
    return decode_utf8(data, str(path))


def read_error(e: OSError, path: str | Path) -> UserError:
    """A failed read of a data file as one line naming it."""
    if isinstance(e, FileNotFoundError):
        return UserError(f"data file not found: {path}")
    if isinstance(e, IsADirectoryError):
        return UserError(f"{path} is a directory, not a text file")
    return UserError(f"cannot read {path}: {e.strerror}")


def decode_utf8(data: bytes, name: str, lines_before: int = 0) -> list[str]:
    """Split UTF-8 bytes into lines (\n or \r\n, or \r alone in a file without \n, as old Mac files have;
    a leading BOM dropped); errors name `name` and the line (counted after `lines_before` earlier lines)."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = lines_before + data.count(b"\n", 0, e.start) + 1
        byte = data[e.start]
        raise UserError(f"{name} line {line}: invalid UTF-8 (byte {byte:#04x}); save the file as UTF-8") from None
    text = text.removeprefix("\ufeff")
    if "\n" not in text and "\r" in text:
        text = text.replace("\r", "\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def fingerprint(paths: list[Path]) -> str:
    """sha256 over the files' bytes: resuming with other data is an error, not a silent mix."""
    digest = hashlib.sha256()
    for path in paths:
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError as e:
            raise read_error(e, path) from None
    return digest.hexdigest()


def stream_lines(path: str | Path, block_bytes: int = 1 << 22) -> Iterator[list[str]]:
    """The lines of a UTF-8 text file in blocks (lists of lines), reading `block_bytes` at a time, so a file of
    any size is read in bounded memory. Same rules and errors as `read_lines` (the line number of an invalid
    byte is counted over the whole file)."""
    path = Path(path)
    try:
        f = open(path, "rb")
    except OSError as e:
        raise read_error(e, path) from None
    with f:
        rest, lines_before, first, cr_only = b"", 0, True, False
        while True:
            try:
                block = f.read(block_bytes)
            except OSError as e:
                raise read_error(e, path) from None
            if first:
                block = block.removeprefix(b"\xef\xbb\xbf")
                cr_only = b"\n" not in block and b"\r" in block
                first = False
            if cr_only:
                block = block.replace(b"\r", b"\n")
            data = rest + block
            cut = len(data) if not block else data.rfind(b"\n") + 1
            rest = data[cut:]
            if cut:
                lines = decode_utf8(data[:cut], str(path), lines_before)
                lines_before += len(lines)
                yield lines
            if not block:
                return


def count_lines(path: str | Path) -> int:
    """The number of lines of a UTF-8 text file, read as a stream (invalid UTF-8 is an error naming the line)."""
    return sum(len(block) for block in stream_lines(path))
