"""The rules that end a run, in one place: the trainer asks them after each update, and the run lifecycle asks
them of a saved train state (a resumed run may have nothing left to do). Torch-free: `tcli preprocess` imports
the lifecycle."""

from __future__ import annotations

from typing import Any


def stop_reason(cfg: Any, step: int, epoch: int, out_of_time: bool, bad_evals: int) -> str | None:
    """Why a run at `step` after `epoch` whole epochs stops under the train config `cfg`, or None.

    Args:
        cfg: the run's train section (max_steps, max_epochs, patience).
        step: updates done.
        epoch: epochs completed.
        out_of_time: whether train.max_minutes has passed (the trainer's ranks agree on it first).
        bad_evals: evaluations in a row without a better best metric.
    """
    if cfg.max_steps and step >= cfg.max_steps:
        return "max_steps"
    if cfg.max_epochs and epoch >= cfg.max_epochs:
        return "max_epochs"
    if out_of_time:
        return "max_minutes"
    if cfg.patience and bad_evals >= cfg.patience:
        return "early_stopping"
    return None


def saved_stop_reason(cfg: Any, train_state: dict[str, Any]) -> str | None:
    """`stop_reason` of a checkpoint's saved train state."""
    out_of_time = cfg.max_minutes is not None and train_state["wall_seconds"] >= 60 * cfg.max_minutes
    return stop_reason(cfg, train_state["step"], train_state["epoch"], out_of_time, train_state["bad_evals"])
