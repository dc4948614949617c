"""Line streams of the commands that read text and write a line per input (translate, predict): the input as a
LineReader, chunks that grow and end where a pipe pauses, and a writer that flushes each chunk's output before
the next chunk is read."""

from __future__ import annotations

import io
import sys
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import TextIO

from transformer_cli.datasets.text import LineReader, open_lines
from transformer_cli.errors import UserError


def open_input(path: Path | None, stdin: TextIO) -> LineReader:
    """--input PATH (or "-"), else stdin, as a LineReader (read in blocks; a pause of a pipe is seen)."""
    if path is None or str(path) == "-":
        stream = stdin.buffer if hasattr(stdin, "buffer") else io.BytesIO(stdin.read().encode())
        return LineReader(stream, "<stdin>")
    return open_lines(path)


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
    """A function that writes text to stdout or --output (opened once) and flushes it: each chunk's
    lines are out before the next chunk is read."""
    if output is None:

        def write(text: str) -> None:
            sys.stdout.write(text)
            sys.stdout.flush()

        return write
    try:
        f = stack.enter_context(open(output, "w", encoding="utf-8"))
    except OSError as e:
        raise UserError(f"--output {output}: cannot write: {e.strerror or e}") from None

    def write_file(text: str) -> None:
        try:
            f.write(text)
            f.flush()
        except OSError as e:
            raise UserError(f"--output {output}: cannot write: {e.strerror or e}") from None

    return write_file
