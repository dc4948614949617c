"""metrics.jsonl (one JSON object per line) and TensorBoard scalars, written together."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from transformer_cli.files import write_atomic
from transformer_cli.metrics_file import parse_event


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
