"""Classification: one label per text (or pair) from the label set training found; the pooled [CLS] vector,
a linear layer to the labels and softmax cross-entropy; the prediction is the most probable label."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from transformer_cli.core.errors import UserError, quote
from transformer_cli.data.labeled import TextExample, look_alike
from transformer_cli.kinds.base import Kind, Meta


class Classification(Kind):
    name = "classification"

    def check_label_set(self, labels: Sequence[str], path: Path) -> None:
        if len(labels) < 2:
            raise UserError(f"{path}: every training example has the label {labels[0]!r}; a classifier needs two")

    def label_warnings(self, labels: Sequence[str], path: Path) -> list[str]:
        return [
            f"warning: {path}: the labels {quote(a)} and {quote(b)} differ only in case or in how a number is "
            "written; the model learns them as two classes (make them one label if they are one)"
            for a, b in look_alike(labels)
        ]

    def check_scorable(self, metrics: Sequence[str], dev: dict[Path | str, list[Any]]) -> None:
        for path, examples in dev.items():
            golds = {ex.label for ex in examples if isinstance(ex, TextExample)}
            if len(golds) == 1 and "mcc" in metrics:
                raise UserError(
                    f"{path}: every example has the label {quote(next(iter(golds)))}, on which MCC is 0 for any "
                    "model; give examples with more than one label, or score it with accuracy"
                )

    def note(self, meta: Meta, preds: list[Any], split: str) -> str | None:
        if len(set(preds)) == 1:
            return f"note: every {split} prediction is {meta.labels[preds[0]]!r} (one class)"
        return None
