"""Lines for the person at the terminal: progress and results go to stderr, so stdout stays the command's output."""

from __future__ import annotations

import sys


def say(quiet: bool, message: str) -> None:
    """Print `message` on stderr unless `quiet`."""
    if not quiet:
        print(message, file=sys.stderr, flush=True)
