"""Reading a run's metrics.jsonl: the one reader of the log for tcli plot, the scripts and the tests.

The trainer writes the log (train/metrics.py); this module only reads it, so that commands run on a finished or
running run (tcli plot) need nothing from the training package.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def read_metrics(run_dir: Path, event: str | None = None, skip_damaged: bool = False) -> list[dict[str, Any]]:
    """The events of `<run_dir>/metrics.jsonl` in order, or only those named `event`.

    A line that is not a JSON object in UTF-8 (one cut short by a kill, or bytes that are not text) raises
    ValueError naming it, or is skipped with `skip_damaged` (a reader of a run that may be running or killed,
    such as tcli plot). Blank lines are skipped.
    """
    path = run_dir / "metrics.jsonl"
    events = []
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if not raw.strip():
                continue
            record = parse_event(raw)
            if record is None:
                if skip_damaged:
                    continue
                raise ValueError(f"{path} line {number} is not a JSON object: {raw[:80]!r}")
            if event is None or record.get("event") == event:
                events.append(record)
    return events


def parse_event(raw: bytes) -> dict[str, Any] | None:
    """One line of the log as its event, or None where it is not a JSON object in UTF-8."""
    try:
        record = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError):
        return None
    return record if isinstance(record, dict) else None


def check_log(run_dir: Path) -> None:
    """Before a resume changes anything: every whole line of `<run_dir>/metrics.jsonl` is an event. The last line
    without its newline, the one a kill may cut short, is the resume's to drop; a damaged line elsewhere (not
    tcli's writing) raises ValueError naming it, instead of being dropped, or failing the resume, on the way."""
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            if raw.endswith(b"\n") and raw.strip() and parse_event(raw) is None:
                raise ValueError(f"{path} line {number} is not a JSON object ({raw[:40]!r})")
