"""The one exception type for a user's mistake: the CLI prints it on one line and exits with code 2."""

from __future__ import annotations

import math
import re

# A number as a person writes it in decimal digits: what float() and int() also read as 3_0 (30), " 5" or an
# Arabic-Indic digit is refused where this is asked (a regression label, a number option).
DECIMAL = re.compile(r"[+-]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][+-]?[0-9]+)?", re.ASCII)


class UserError(Exception):
    """A problem the user can fix (bad config, bad data, missing file). Shown without a traceback."""

    exit_code = 2


def one_line(text: str, limit: int = 600) -> str:
    """A message on one line, cut to `limit` characters: a hostile input never floods the terminal."""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1] + "…"


def finite_number(value: object) -> bool:
    """Whether a value read from a user's file is a finite int or float (not a bool, a string, NaN or inf)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def quote(value: object, limit: int = 100) -> str:
    """repr(value) cut to about `limit` characters, for quoting user input in an error."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"
