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
            try:
                record = json.loads(raw.decode("utf-8"))
            except (UnicodeDecodeError, ValueError, RecursionError):
                record = None
            if not isinstance(record, dict):
                if skip_damaged:
                    continue
                raise ValueError(f"{path} line {number} is not a JSON object: {raw[:80]!r}")
            if event is None or record.get("event") == event:
                events.append(record)
    return events
