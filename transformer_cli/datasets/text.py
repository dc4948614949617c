"""Reading user text: strict UTF-8, and errors that name the file and the line."""

from __future__ import annotations

import hashlib
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


def decode_utf8(data: bytes, name: str) -> list[str]:
    """Split UTF-8 bytes into lines (\n or \r\n, or \r alone in a file without \n, as old Mac files have;
    a leading BOM dropped); errors name `name` and the line."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
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
