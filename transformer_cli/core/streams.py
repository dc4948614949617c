"""Line streams of the commands that read text and write a line per input (translate, predict): the input as a
LineReader, chunks that grow and end where a pipe pauses, and a writer that flushes each chunk's output before
the next chunk is read."""

from __future__ import annotations

import errno
import io
import os
import stat
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TextIO

from transformer_cli.core.errors import UserError
from transformer_cli.core.files import check_distinct
from transformer_cli.core.text import LineReader, open_lines


def is_standard(path: Path | None) -> bool:
    """No path, or "-": standard input for --input, standard output for --output."""
    return path is None or str(path) == "-"


def open_input(path: Path | None, stdin: TextIO) -> LineReader:
    """--input PATH (or "-"), else stdin, as a LineReader (read in blocks; a pause of a pipe is seen)."""
    if is_standard(path):
        stream = stdin.buffer if hasattr(stdin, "buffer") else io.BytesIO(stdin.read().encode())
        return LineReader(stream, "<stdin>")
    return open_lines(path)


def check_writable(path: Path | None, option: str) -> None:
    """Fail before any work when an output file cannot be written (no such folder, a directory, read-only), or
    must not be (a checkpoint: `-o` naming one by mistake would replace it with text)."""
    if path is None:
        return
    if str(path) == "-":
        raise UserError(f"{option} -: give a file name (- stands for standard output only with --output)")
    if path.is_dir():
        raise UserError(f"{option} {path} is a directory; give a file name")
    if _holds_a_checkpoint(path):
        raise UserError(
            f"{option} {path} holds a checkpoint (a torch file): text written over it would destroy it; "
            "give another path"
        )
    if _link_loop(path):
        raise UserError(f"{option} {path} is a loop of symbolic links; give a file name")
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise UserError(f"{option} {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise UserError(f"{option} {path} is not writable")


def _holds_a_checkpoint(path: Path) -> bool:
    """Whether `path` is a file in torch.save's format (a zip archive): a checkpoint, whatever its name. Only a
    regular file is opened: opening a FIFO (`-o >(gzip > out.gz)`, a named pipe) to read would block."""
    if not path.is_file():
        return False
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"PK\x03\x04"
    except OSError:
        return False


def _link_loop(path: Path) -> bool:
    try:
        os.stat(path)
    except OSError as e:
        return e.errno == errno.ELOOP
    return False


def check_outputs(outputs: Sequence[tuple[str, Path | None]], inputs: Sequence[tuple[str, Path | None]]) -> None:
    """Before any work: every output file can be written, and none is a file the command reads or another
    output (`--output` naming the input or the checkpoint would destroy it)."""
    check_distinct(outputs, inputs)  # first: the more telling message where an output names the checkpoint
    for option, path in outputs:
        check_writable(path, option)
    (main, main_path), *others = outputs
    if is_standard(main_path):  # the results go to stdout: another output that is stdout's file would truncate it
        for option, path in others:
            if path is not None and _is_stream_file(sys.stdout, path):
                raise UserError(
                    f"{option} {path} is the file standard output writes to, where the results go without {main}: "
                    f"opening it would empty that file; give {option} another path"
                )
    reads_stdin = any(option == "--input" and is_standard(path) for option, path in inputs)
    for option, path in outputs if reads_stdin else ():  # `-o in.txt < in.txt`: emptied after its first chunk
        if not is_standard(path) and _is_stream_file(sys.stdin, path):
            raise UserError(
                f"{option} {path} is the file standard input reads from, the input: writing it would empty it "
                f"while it is read; give {option} another path"
            )


def _is_stream_file(stream: Any, path: Path) -> bool:
    """Whether `path` names the regular file a standard stream of this process was redirected to or from
    (`/dev/stdout`, or the file itself, with `> out.txt` or `< in.txt`)."""
    try:
        ours = os.fstat(stream.fileno())
        return stat.S_ISREG(ours.st_mode) and os.path.samestat(ours, os.stat(path))
    except (OSError, ValueError, AttributeError, io.UnsupportedOperation):  # no file behind it (a test's buffer)
        return False


def first_chunk(output: Path | None, first: int, most: int) -> int:
    """The lines of the first chunk: `first` where the output goes to stdout, whose first lines someone may be
    reading as they come (a terminal, `| head`); `most` where it goes to a file, read when the command ends:
    full chunks from the start make fewer, fuller batches (a 1,000-line file in 1 chunk, not 5)."""
    return first if output is None else most


def chunks(lines: LineReader, first: int, most: int) -> Iterator[list[str]]:
    """The input in chunks of `first` lines, then twice as many, ... up to `most`.
    A chunk also ends where the input pauses (a pipe or terminal with no next line written yet), so the
    lines that have come are processed without waiting for more."""
    size, chunk = first, []
    try:
        for line in lines:
            chunk.append(line)
            if len(chunk) >= size or lines.waiting():
                yield chunk
                chunk, size = [], min(2 * size, most)
    except UserError:  # an invalid line: every line before it is processed and written, then the error
        if chunk:
            yield chunk
        raise
    if chunk:
        yield chunk


def writer(output: Path | None, stack: ExitStack) -> Callable[[str], None]:
    """A function that writes text to stdout or --output and flushes it: each chunk's lines are out before the
    next chunk is read. --output is opened at the first write (an empty input: when the stack closes without
    an error), so a run that fails before its first line (a bad checkpoint, table or first line) leaves an
    existing file as it was; a write or close the system refuses is one line."""
    if output is None:

        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        return write
    opened: list[TextIO] = []

    def refused(e: OSError) -> UserError:
        return UserError(f"--output {output}: cannot write: {e.strerror or e}")

    def file() -> TextIO:
        if not opened:
            opened.append(open(output, "w", encoding="utf-8"))
        return opened[0]

    def finish(exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        try:
            if exc_type is None:
                file()  # no line to write: the output of an empty input is an empty file
            if opened:
                opened.pop().close()
        except OSError as e:
            if exc_type is None:
                raise refused(e) from None

    stack.push(finish)

    def write_file(text: str) -> None:
        try:
            f = file()
            f.write(text)
            f.flush()
        except OSError as e:
            raise refused(e) from None

    return write_file
