"""`tcli plot`: a run's curves from its metrics.jsonl in one figure, against update step and wall time.

Rows: training loss with the validation loss, the validation quality (BLEU, MLM/NSP accuracy for BERT, or a
fine-tuning run's dev metrics), the learning rate, training throughput. Left column against the update step,
right column against wall time. Eval and end events carry `wall_s`; train events do not, so their wall time is
interpolated linearly in the step between the known (step, wall_s) points, starting from (0, 0 s);
train events after the last known point are left out of the wall-time column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from transformer_cli.core.errors import UserError, finite_number
from transformer_cli.core.figures import check_image_replaceable, image_format, printable, save_figure
from transformer_cli.core.files import check_replaceable
from transformer_cli.core.metrics_log import read_metrics
from transformer_cli.metrics import task_metrics

# (row title, [(event, key, label)]): the first series of a row that the log has decides its presence.
ROWS: list[tuple[str, list[tuple[str, str, str]]]] = [
    (
        "loss",
        [
            ("train", "loss", "training loss"),
            ("eval", "valid_loss", "validation loss"),
            ("eval", "mlm_loss", "validation MLM loss"),
        ],
    ),
    (
        "validation",
        [("eval", "bleu", "BLEU"), ("eval", "mlm_acc", "MLM accuracy"), ("eval", "nsp_acc", "NSP accuracy")]
        + [("eval", name, name) for name in task_metrics.METRICS],  # a fine-tuning run's dev metrics
    ),
    ("learning rate", [("train", "lr", "learning rate")]),
    ("tokens/s", [("train", "tgt_tokens_per_sec", "target tokens/s"), ("train", "tokens_per_sec", "tokens/s")]),
]


def check_run_dir(run_dir: Path) -> None:
    if not run_dir.is_dir():
        what = "a file" if run_dir.exists() else "no such folder"
        raise UserError(f"{run_dir} is not a run directory ({what}); give the folder a run's --out named")


def read_events(run_dir: Path) -> list[dict[str, Any]]:
    """The events of `<run_dir>/metrics.jsonl`; a line that is not one (cut short by a kill, not UTF-8, not
    JSON, or with a step or wall time that is not a finite number) is skipped. One-line errors for a missing
    folder or log, or a log without train or eval events."""
    path = run_dir / "metrics.jsonl"
    check_run_dir(run_dir)
    if not path.is_file():
        raise UserError(f"{path} not found: is {run_dir} a run directory of tcli train / pretrain-bert / finetune?")
    try:
        events = [e for e in read_metrics(run_dir, skip_damaged=True) if _plottable(e)]
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    if not any(e["event"] in ("train", "eval") for e in events):
        raise UserError(f"{path} holds no train or eval events yet; nothing to plot")
    return events


def _plottable(event: dict[str, Any]) -> bool:
    """A train, eval or end event whose step (and wall_s, when given) are numbers."""
    if event.get("event") not in ("train", "eval", "end"):
        return False
    return finite_number(event.get("step")) and ("wall_s" not in event or finite_number(event["wall_s"]))


def wall_clock(events: list[dict[str, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(steps, seconds) of the events that carry wall_s, from (0, 0), for interpolation."""
    known = sorted({(0, 0.0), *((e["step"], float(e["wall_s"])) for e in events if finite_number(e.get("wall_s")))})
    steps, seconds = zip(*known)
    return np.array(steps, dtype=float), np.array(seconds, dtype=float)


def series(events: list[dict[str, Any]], event: str, key: str) -> tuple[np.ndarray, np.ndarray]:
    rows = [(e["step"], e[key]) for e in events if e["event"] == event and finite_number(e.get(key))]
    if not rows:
        return np.array([]), np.array([])
    steps, values = zip(*rows)
    return np.array(steps, dtype=float), np.array(values, dtype=float)


def _rows(events: list[dict[str, Any]]) -> list[tuple[str, list[tuple[str, np.ndarray, np.ndarray]]]]:
    """The rows of ROWS that the log has data for, each with its (label, steps, values) series."""
    rows = []
    for title, specs in ROWS:
        found = [(label, *series(events, event, key)) for event, key, label in specs]
        found = [f for f in found if f[1].size]
        if found:
            rows.append((title, found))
    return rows


def plot_run(run_dir: Path, out: Path | None = None) -> Path:
    """Draw the run's curves into `out` (default `<run_dir>/curves.png`; a name without an extension is a PNG
    under that very name), atomically; returns the path."""
    from transformer_cli.core.figures import require_matplotlib, text_fonts

    figure_module = require_matplotlib()
    if out is None:
        check_run_dir(run_dir)  # the default --out is inside it: the folder is named first
        out = run_dir / "curves.png"
    if str(out) == "-" or out.is_dir() or not out.parent.is_dir():
        raise UserError(f"--out {out}: give a file in an existing folder")
    check_replaceable(out)  # before drawing, not after
    check_image_replaceable(out, image_format(out, "--out"), "--out")
    events = read_events(run_dir)
    known_steps, known_seconds = wall_clock(events)
    rows = _rows(events)
    if not rows:
        raise UserError(f"{run_dir / 'metrics.jsonl'} holds no finite values of a plotted metric; nothing to plot")
    with text_fonts([run_dir.name]):
        draw_curves(figure_module, run_dir.name, rows, known_steps, known_seconds, out)
    return out


def draw_curves(
    figure_module: Any,
    name: str,
    rows: list[tuple[str, list[tuple[str, np.ndarray, np.ndarray]]]],
    known_steps: np.ndarray,
    known_seconds: np.ndarray,
    out: Path,
) -> None:
    """The figure of `plot_run`: a row per metric, by update step and by wall time, saved to `out`."""
    fig = figure_module.Figure(figsize=(12, 2.6 * len(rows) + 0.6), layout="constrained")
    fig.suptitle(f"{printable(name)}: metrics.jsonl", fontsize=12)
    axes = fig.subplots(len(rows), 2, squeeze=False)
    for (title, found), (by_step, by_time) in zip(rows, axes):
        for label, steps, values in found:
            marker = "o" if len(steps) < 30 else None
            by_step.plot(steps, values, label=label, marker=marker, markersize=3)
            timed = steps <= known_steps[-1]
            minutes = np.interp(steps[timed], known_steps, known_seconds) / 60
            by_time.plot(minutes, values[timed], label=label, marker=marker, markersize=3)
        for ax, xlabel in ((by_step, "update step"), (by_time, "wall time (min)")):
            ax.set_ylabel(found[0][0] if len(found) == 1 else title)
            ax.set_xlabel(xlabel)
            ax.grid(alpha=0.3)
            if len(found) > 1:
                ax.legend(fontsize=8)
    axes[0, 1].set_title("train points: wall time interpolated between eval/end events", fontsize=9)
    save_figure(fig, out, dpi=100)
