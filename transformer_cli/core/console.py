"""Lines for the person at the terminal: progress and results go to stderr, so stdout stays the command's output."""

from __future__ import annotations

import io
import os
import sys


def say(quiet: bool, message: str) -> None:
    """Print `message` on stderr unless `quiet`."""
    if not quiet:
        print(message, file=sys.stderr, flush=True)


class ClosedStream:
    """Stands for a standard stream the shell closed (`>&-`, `<&-`), which Python leaves as None: a write was then
    an AttributeError traceback, or output that click dropped in silence with exit code 0. Through this, the
    first read or write is a one-line error instead (exit code 2); flushing an untouched stream is no error."""

    def __init__(self, name: str, fix: str):
        self.name, self.fix = name, fix

    def _refuse(self, *args, **kwargs):
        from transformer_cli.core.errors import UserError

        raise UserError(f"standard {self.name} is closed; {self.fix}")

    write = writelines = read = readline = readlines = __iter__ = _refuse
    buffer = property(_refuse)

    def fileno(self) -> int:
        raise io.UnsupportedOperation("fileno")

    def flush(self) -> None:
        pass

    def isatty(self) -> bool:
        return False


def guard_closed_streams() -> None:
    """Put a ClosedStream where the shell closed stdout or stdin; a closed stderr gets /dev/null (the messages
    have nowhere to go, the exit code still tells)."""
    if sys.stdout is None:
        sys.stdout = ClosedStream("output", "send it to a file instead (> FILE, or --output where the command has one)")
    if sys.stdin is None:
        sys.stdin = ClosedStream("input", "read from a file instead (< FILE, or --input where the command has one)")
    if sys.stderr is None:
        sys.stderr = open(os.devnull, "w")  # noqa: SIM115 (open for the life of the process)
