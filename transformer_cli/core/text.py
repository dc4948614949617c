"""Reading user text: strict UTF-8, and errors that name the file and the line."""

from __future__ import annotations

import hashlib
import io
import os
import select
import stat
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np

from transformer_cli.core.errors import UserError


def read_lines(path: str | Path) -> list[str]:
    """The lines of a UTF-8 text file, without line endings. Invalid UTF-8 names file and line.
    A stream that is no regular file (a FIFO, /dev/zero) is read line by line, each line bounded (LineReader)."""
    path = Path(path)
    try:
        streamed = not stat.S_ISREG(os.stat(path).st_mode) and not path.is_dir()
    except OSError:
        streamed = False  # missing, or unreadable: the read below names it
    if streamed:
        with open_lines(path) as reader:
            return list(reader)
    try:
        data = path.read_bytes()
    except OSError as e:
        raise read_error(e, path) from None
    return decode_utf8(data, str(path))


def check_data_file(path: str | Path) -> None:
    """A training data file is a regular file (or a link to one): it is read more than once (indexed, hashed,
    tokenised), and a FIFO would block until a writer came (forever, for one without) while /dev/zero never
    ends its first line. Missing files and folders are left to the read, whose errors name them."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise UserError(
            f"{path} is not a regular file (a FIFO, device or socket): training data is read more than once; "
            "save it to a file"
        )


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
    text, bad = decode_text(data)
    if bad >= 0:
        raise text_error(name, data.count(b"\n", 0, bad) + 1, data[bad])
    text = text.removeprefix("\ufeff")
    if "\n" not in text and "\r" in text:
        text = text.replace("\r", "\n")
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def invalid_utf8(name: str, line: int, byte: int) -> UserError:
    return UserError(f"{name} line {line}: invalid UTF-8 (byte {byte:#04x}); save the file as UTF-8")


def nul_byte(name: str, line: int) -> UserError:
    """A NUL byte is valid UTF-8 but no text: a binary file (/dev/zero, an image) would be tokenised as text."""
    return UserError(
        f"{name} line {line}: a NUL byte (0x00), which text never holds (a binary file?); give a text file"
    )


def decode_text(data: bytes) -> tuple[str, int]:
    """(the UTF-8 text of `data`, -1), or ("", the offset of its first byte that is no text: invalid UTF-8 or a
    NUL, whichever comes first). One decode: it is the check and the text."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        nul = data.find(b"\0", 0, e.start)
        return "", e.start if nul < 0 else nul
    nul = data.find(b"\0")
    return (text, -1) if nul < 0 else ("", nul)


def text_error(name: str, line: int, byte: int) -> UserError:
    """The error for the byte `decode_text` found on `line`."""
    return nul_byte(name, line) if byte == 0 else invalid_utf8(name, line, byte)


BOM = "\ufeff"


MAX_STREAM_LINE_BYTES = 64 << 20  # a line longer than this from a device or a pipe is no text


class LineReader:
    """The lines of a binary stream (a file, a pipe, a terminal) as they arrive, a block at a time.

    For any input the lines are those `decode_utf8` gives for the whole of it (strict UTF-8, \n or \r\n,
    a leading BOM dropped, errors naming `name` and the line), with one difference: whether \r alone ends
    lines (old Mac files) is decided from the start of the input, not from all of it: \n ends lines as
    soon as one appears; \r does when the first `decide_bytes` (or the whole input, if shorter) hold \r
    and no \n. It holds at most one block's lines, so a file of any length is read in bounded memory.
    """

    def __init__(
        self, stream: BinaryIO, name: str, block_size: int = 1 << 16, decide_bytes: int = 1 << 16, owned: bool = False
    ):
        self.name = name
        self._stream, self._owned = stream, owned  # owned: closed on leaving a `with` block
        self.lines_read = 0  # lines decoded so far: the next error's line numbers count from here
        # read1 returns what a pipe holds now instead of waiting for a whole block.
        self._read = getattr(stream, "read1", stream.read)
        self._fd = _fileno(stream)
        self._regular = self._fd is not None and _is_regular(self._fd)
        self._block_size, self._decide_bytes = block_size, decide_bytes
        self._ready: deque[str] = deque()  # decoded lines not yet handed out
        self._pending: list[bytes] = []  # the bytes after the last line ending
        self._held = 0  # bytes read while the line ending is undecided
        self._unended = 0  # bytes read since the last block that held a line ending (about the open line's length)
        self._sep: bytes | None = None  # b"\n" or b"\r", once decided
        self._eof = False
        self._error: UserError | None = None  # an invalid line: raised once the lines before it are handed out

    def __iter__(self) -> Iterator[str]:
        return self

    def __enter__(self) -> LineReader:
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            self._stream.close()

    def __next__(self) -> str:
        if not self._wait():
            raise StopIteration
        return self._ready.popleft()

    def blocks(self) -> Iterator[list[str]]:
        """The lines in lists, as each read decodes them (for a reader that takes many at a time)."""
        while self._wait():
            block = list(self._ready)
            self._ready.clear()
            yield block

    def _wait(self) -> bool:
        """Read until a line is ready (True) or the input has ended (False); an invalid line raises here, once
        the lines before it are handed out."""
        while not self._ready:
            if self._error is not None:
                raise self._error
            if self._eof:
                return False
            self._fill()
        return True

    def waiting(self) -> bool:
        """True when no line is ready and the next has not arrived (a pipe or terminal whose writer
        pauses): the caller can work on what it has instead of blocking. Reads what has arrived."""
        while not self._ready and not self._eof and self._error is None:
            if not self._readable():
                return True
            self._fill()
        return False

    def _readable(self) -> bool:
        if self._fd is None:
            return True
        try:
            return bool(select.select([self._fd], [], [], 0)[0])
        except (OSError, ValueError):  # no select on this kind of file: reading is all there is
            return True

    def _fill(self) -> None:
        """One read; decodes the lines it completes."""
        if self._error is not None:
            return
        try:
            block = self._read(self._block_size)
        except OSError as e:
            raise read_error(e, self.name) from None
        self._eof = not block
        self._pending.append(block)
        if self._sep is None:
            self._held += len(block)
            if b"\n" in block:
                self._sep = b"\n"
            elif not self._eof and self._held < self._decide_bytes:
                return
            else:
                self._sep = b"\r" if any(b"\r" in b for b in self._pending) else b"\n"
        elif self._sep not in block and not self._eof:
            self._unended += len(block)
            self._check_line_length()
            return
        self._unended = 0
        data = b"".join(self._pending)
        if self._eof:
            self._pending = []
            if data.endswith(self._sep):
                self._decode(data[:-1])
            elif data:
                self._decode(data, last=True)
            return
        end = data.rfind(self._sep)
        if end < 0:
            self._pending = [data]
            return
        self._pending = [data[end + 1 :]]
        self._decode(data[:end])

    def _check_line_length(self) -> None:
        """A line without end from a stream that is no file (`--input /dev/zero`, a pipe that never writes a line
        ending) would fill the memory: past MAX_STREAM_LINE_BYTES it is one line. A regular file's line is
        bounded by the file."""
        if self._regular or self._unended <= MAX_STREAM_LINE_BYTES:
            return
        raise UserError(
            f"{self.name}: line {self.lines_read + 1} has over {MAX_STREAM_LINE_BYTES >> 20} MiB and no line end, "
            "and the input is no regular file (a device or a stream that never ends a line); give a text file"
        )

    def _decode(self, data: bytes, last: bool = False) -> None:
        """Decodes `data`, whole lines joined by the line ending; `last`: the input's unended end."""
        text, bad = decode_text(data)
        if bad >= 0:  # the lines before it are given, then the error
            self._error = text_error(self.name, self.lines_read + data.count(self._sep, 0, bad) + 1, data[bad])
            good = data.rfind(self._sep, 0, bad)  # the end of the last whole line before it
            if good >= 0:
                self._decode(data[:good])
            return
        if self.lines_read == 0:
            text = text.removeprefix(BOM)
        if last and not text:
            return  # an input that is only a BOM
        lines = text.split(self._sep.decode())
        if self._sep == b"\n":
            lines = [line.removesuffix("\r") for line in lines]
        self.lines_read += len(lines)
        self._ready.extend(lines)


def _is_regular(fd: int) -> bool:
    try:
        return stat.S_ISREG(os.fstat(fd).st_mode)
    except OSError:
        return False


def _fileno(stream: BinaryIO) -> int | None:
    try:
        return stream.fileno()
    except (AttributeError, OSError, ValueError, io.UnsupportedOperation):
        return None


def open_lines(path: str | Path, block_size: int = 1 << 16) -> LineReader:
    """A LineReader over a file, opened now (a missing file fails before any work); `with` closes it."""
    try:
        stream = open(path, "rb")
    except OSError as e:
        raise read_error(e, path) from None
    return LineReader(stream, str(path), block_size=block_size, owned=True)


def fingerprint(paths: list[Path]) -> str:
    """sha256 over the files' bytes: resuming with other data is an error, not a silent mix."""
    digest = hashlib.sha256()
    for path in paths:
        check_data_file(path)
        try:
            with open(path, "rb") as f:
                for block in iter(lambda: f.read(1 << 20), b""):
                    digest.update(block)
        except OSError as e:
            raise read_error(e, path) from None
    return digest.hexdigest()


STREAM_BYTES = 1 << 22


def stream_lines(path: str | Path, block_bytes: int = STREAM_BYTES) -> Iterator[list[str]]:
    """The lines of a UTF-8 text file in lists, read `block_bytes` at a time, so that a file of any size is
    read in bounded memory (the lines and errors of `LineReader`)."""
    check_data_file(path)
    with open_lines(path, block_bytes) as reader:
        yield from reader.blocks()


# ----------------------------------------------------------------------------- blocks of lines, read anywhere


@dataclass(frozen=True)
class LineIndex:
    """Where every `block`-th line of a text file starts, so that its blocks of lines can be read and decoded
    independently (by worker processes), each giving exactly the lines `stream_lines` gives there."""

    path: Path
    lines: int
    sep: bytes  # the line ending: b"\n" (a \r before it is dropped), or b"\r" in old Mac files
    starts: np.ndarray  # (blocks + 1,) int64 byte offsets: block k is bytes starts[k]:starts[k + 1]
    block: int  # lines per block
    size: int
    sha256: str

    def blocks(self) -> Iterator[Block]:
        for k in range(len(self.starts) - 1):
            first = k * self.block
            yield Block(
                self.path,
                self.sep,
                first,
                min(self.block, self.lines - first),
                int(self.starts[k]),
                int(self.starts[k + 1]),
            )


@dataclass(frozen=True)
class Block:
    """Lines first .. first + lines - 1 of a file: its bytes start .. end - 1 (what a worker is sent)."""

    path: Path
    sep: bytes
    first: int
    lines: int
    start: int
    end: int


def index_lines(path: str | Path, block: int, chunk_bytes: int = 1 << 22, also: Any = None) -> LineIndex:
    """One pass over a file in bounded memory: its lines counted, checked as strict UTF-8 (an error names the
    line), its sha256, and the byte offset of every `block`-th line. The line ending is decided from the
    first STREAM_BYTES, as `stream_lines` does. `also`: a hashlib object the bytes are fed to as well."""
    path = Path(path)
    check_data_file(path)
    digest = hashlib.sha256()
    starts: list[np.ndarray] = [np.zeros(1, np.int64)]
    lines, base, carry = 0, 0, b""
    try:
        with open(path, "rb") as f:
            head = f.read(STREAM_BYTES)
            sep = b"\n" if b"\n" in head or b"\r" not in head else b"\r"
            f.seek(0)
            while True:
                chunk = f.read(chunk_bytes)
                digest.update(chunk)
                if also is not None:
                    also.update(chunk)
                data = carry + chunk
                end = data.rfind(sep) + 1 if chunk else len(data)  # whole lines only, until the end
                whole, carry = data[:end], data[end:]
                if (bad := decode_text(whole)[1]) >= 0:
                    raise text_error(str(path), lines + whole.count(sep, 0, bad) + 1, whole[bad])
                for at in range(0, len(whole), 1 << 18):  # counted a piece at a time; located only where a block starts
                    piece = whole[at : at + (1 << 18)]
                    count = piece.count(sep)
                    if (lines + count) // block > lines // block:
                        ends = np.flatnonzero(np.frombuffer(piece, np.uint8) == sep[0]) + base + at + 1  # next lines
                        numbers = np.arange(lines + 1, lines + 1 + count)
                        starts.append(ends[numbers % block == 0])
                    lines += count
                base += len(whole)
                if not chunk:
                    break
    except OSError as e:
        raise read_error(e, path) from None
    if whole and not (base == len(BOM.encode()) and whole == BOM.encode()):  # the last line has no line ending
        lines += 1
    offsets = np.concatenate(starts)
    offsets = np.append(offsets[offsets < base] if lines else offsets[:0], base)
    return LineIndex(path, lines, sep, offsets.astype(np.int64), block, base, digest.hexdigest())


def read_block(block: Block) -> list[str]:
    """The lines of a block (from `LineIndex.blocks`): those `stream_lines` gives there."""
    name = str(block.path)
    try:
        with open(block.path, "rb") as f:
            f.seek(block.start)
            data = f.read(block.end - block.start)
    except OSError as e:
        raise read_error(e, name) from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise invalid_utf8(name, block.first + data.count(block.sep, 0, e.start) + 1, data[e.start]) from None
    if block.start == 0:
        text = text.removeprefix(BOM)
    sep = block.sep.decode()
    lines = text.removesuffix(sep).split(sep) if text else []
    if block.sep == b"\n":
        lines = [line.removesuffix("\r") for line in lines]
    if len(data) != block.end - block.start or len(lines) != block.lines:
        raise UserError(f"{name} changed while it was being read; run the command again")
    return lines


# ----------------------------------------------------------------------------- documents


def check_document_counts(
    documents: int, longest: int, name: str, fmt: str = "text", split_sentences: bool | None = None
) -> None:
    """check_corpus from the counts: `documents` documents, the longest with `longest` sentences. The advice is for a
    config that can still change data.format; with `split_sentences` (a checkpoint's reading, which the user cannot
    change) it says how that checkpoint reads a file instead."""
    fixed = split_sentences is not None
    if not documents:
        raise UserError(f"{name} holds no text: BERT pretraining needs documents separated by blank lines")
    if documents < 2:
        if fixed:
            starts = "a ' = Title = ' line starts each document" if fmt == "wikitext" else "blank lines separate them"
            how = f"the checkpoint reads data.format: {fmt}, where {starts}"
        elif fmt == "wikitext":
            how = (
                "no ' = Title = ' line starts a second document; plain text with blank lines between documents "
                "needs data.format: text"
            )
        else:
            how = "separate documents with a blank line, or use data.format: wikitext for WikiText files"
        raise UserError(f"{name} holds a single document; next sentence prediction needs at least two ({how})")
    if longest < 2:
        if fixed:
            how = (
                "the checkpoint splits lines into sentences (data.split_sentences: true) and found one per document"
                if split_sentences
                else "the checkpoint reads one sentence per line (data.split_sentences: false)"
            )
        else:
            how = "one sentence per line, or set data.split_sentences: true"
        raise UserError(f"{name}: no document has two sentences, so there is no real next sentence ({how})")
