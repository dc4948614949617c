"""A run's metrics.jsonl (one JSON object per line): written by the trainer together with TensorBoard
scalars, and read back by one reader (tcli plot, the resume check, the scripts and the tests).

TensorBoard is imported only when a log is written, so readers (tcli plot) load nothing of training.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from transformer_cli.core.files import write_atomic


class MetricsLog:
    """Appends events to `<run>/metrics.jsonl` and mirrors their numbers to TensorBoard under `<run>/tb`.

    TensorBoard tags: train events -> train/<key>; eval events -> valid/<key> (a `valid_` prefix dropped).
    On resume, events after the checkpoint's step are cut from metrics.jsonl and TensorBoard purges
    them too, so a killed-and-resumed run reads like an uninterrupted one.
    """

    def __init__(self, run_dir: Path, resume_step: int | None = None, enabled: bool = True):
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self.tb = None
        if not enabled:
            return
        if resume_step is not None and self.path.exists():
            self._truncate_after(resume_step)
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(run_dir / "tb"), purge_step=resume_step + 1 if resume_step is not None else None)

    def _truncate_after(self, step: int) -> None:
        """The log as of `step`, written atomically (a kill while it is written leaves the old log). Its lines were
        checked before the resume began (metrics_file.check_log): only a last line cut short by a kill is no event."""
        kept = []
        for raw in self.path.read_bytes().splitlines():
            event = parse_event(raw)
            if event is None:
                continue  # a line cut short by a kill
            if event.get("event") in ("train", "eval") and event.get("step", 0) > step:
                continue
            if event.get("event") in ("end", "test", "averaged"):
                continue
            kept.append(raw + b"\n")
        write_atomic(b"".join(kept), self.path)

    def log(self, event: str, step: int, **values: Any) -> dict[str, Any]:
        record = {"event": event, "step": step, **{k: _clean(v) for k, v in values.items()}}
        if not self.enabled:
            return record
        with open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(record) + "\n")
        prefix = {"train": "train", "eval": "valid", "test": "test", "averaged": "averaged"}.get(event)
        if prefix and self.tb is not None:
            for key, value in values.items():
                if isinstance(value, (int, float)) and key != "epoch" and not isinstance(value, bool):
                    self.tb.add_scalar(f"{prefix}/{key.removeprefix('valid_')}", value, step)
        return record

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None


def _clean(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 6) if math.isfinite(value) else None
    return value


# ----------------------------------------------------------------------------- reading metrics.jsonl


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
