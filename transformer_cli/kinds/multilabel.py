"""Multi-label classification: a set of labels per text (or pair), from the label set training found; the pooled
[CLS] vector, a linear layer to one logit per label and binary cross-entropy on each (as Hugging Face's
problem_type "multi_label_classification"). A label is predicted when its sigmoid probability is above the
threshold (task.threshold, or the one tuned on the dev set, kept in the checkpoint); none may be."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from transformer_cli.core.errors import UserError
from transformer_cli.kinds.base import Meta
from transformer_cli.kinds.classification import Classification
from transformer_cli.metrics import task_metrics

# The thresholds `task.threshold: tune` tries; of equal scores the one nearest 0.5 wins.
TUNING_GRID = tuple(round(0.05 * i, 2) for i in range(1, 20))


class Multilabel(Classification):
    name = "multilabel"
    label_form = "multilabel"
    loss = "bce"
    label_dtype = torch.float32
    fewest_labels = 1
    problem_type = "multi_label_classification"

    def check_label_set(self, labels: Sequence[str], path: Path) -> None:
        if not labels:
            raise UserError(f"{path}: no training example has a label; give the labels that apply to each text")

    def check_scorable(self, metrics: Sequence[str], dev: dict[Path | str, list[Any]]) -> None:
        return None  # F1 over labels tells models apart on any dev set with a label

    def label_value(self, label: Any, index: dict[str, int]) -> Any:
        """The multi-hot row of a set of labels."""
        row = [0.0] * len(index)
        for name in label:
            row[index[name]] = 1.0
        return row

    def probabilities(self, logits: list[Tensor]) -> np.ndarray:
        """(N, L) sigmoid probabilities."""
        return torch.stack(logits).sigmoid().numpy() if logits else np.zeros((0, 0))

    def decide(self, meta: Meta, logits: list[Tensor]) -> tuple[list[Any], list[float]]:
        """Per example the (label id, probability) of each label above the threshold, most probable first, and
        the highest probability."""
        preds: list[Any] = []
        probs: list[float] = []
        for row in self.probabilities(logits):
            above = [(int(j), float(row[j])) for j in np.argsort(-row, kind="stable") if row[j] > meta.threshold]
            preds.append(above)
            probs.append(float(row.max()) if row.size else 0.0)
        return preds, probs

    def gold(self, meta: Meta, examples: list[Any]) -> list[list[int]]:
        index = {label: i for i, label in enumerate(meta.labels)}
        return [[int(v) for v in self.label_value(ex.label, index)] for ex in examples]

    def scored(self, meta: Meta, examples: list[Any], preds: list[Any]) -> tuple[list[Any], list[Any]]:
        rows = [[0] * len(meta.labels) for _ in preds]
        for row, chosen in zip(rows, preds):
            for j, _ in chosen:
                row[j] = 1
        return rows, self.gold(meta, examples)

    def tuned_threshold(self, meta: Meta, metrics: Sequence[str], examples: list[Any], logits: list[Tensor]) -> float:
        """The threshold of TUNING_GRID whose predictions score best (the mean of `metrics`) on `examples`."""
        probs, gold = self.probabilities(logits), self.gold(meta, examples)

        def score(t: float) -> float:
            results = task_metrics.compute(metrics, (probs > t).astype(int), gold, meta.labels)
            return task_metrics.main_value(results, metrics)

        return max(sorted(TUNING_GRID, key=lambda t: abs(t - 0.5)), key=score)

    def note(self, meta: Meta, preds: list[Any], split: str) -> str | None:
        if not any(preds):
            return f"note: no {split} prediction has a label above the threshold {meta.threshold:g}"
        return None

    def format(self, meta: Meta, example: Any, pred: Any, prob: float) -> str:
        """`label<TAB>probability` for each label above the threshold, most probable first, on one line (an empty
        line when there is none)."""
        return "\t".join(f"{meta.labels[j]}\t{p:.4f}" for j, p in pred) + "\n"
