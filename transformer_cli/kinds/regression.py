"""Regression: one number per text (or pair); the pooled [CLS] vector, a linear layer to one output and the
squared error; the prediction is that output (as Hugging Face's problem_type "regression", num_labels 1)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from transformer_cli.core.errors import UserError
from transformer_cli.data.labeled import TextExample
from transformer_cli.kinds.base import Kind, Meta


class Regression(Kind):
    name = "regression"
    label_form = "regression"
    loss = "mse"
    label_dtype = torch.float32
    has_label_set = False
    fewest_labels = most_labels = 0
    problem_type = "regression"

    def outputs(self, labels: Sequence[str]) -> int:
        return 1

    def hf_labels(self, labels: Sequence[str]) -> list[str]:
        return ["LABEL_0"]

    def describe_outputs(self, labels: Sequence[str]) -> str:
        return "1 output"

    def check_scorable(self, metrics: Sequence[str], dev: dict[Path | str, list[Any]]) -> None:
        for path, examples in dev.items():
            golds = {ex.label for ex in examples if isinstance(ex, TextExample)}
            if len(golds) == 1 and {"pearson", "spearman"} & set(metrics):
                raise UserError(
                    f"{path}: every example has the score {next(iter(golds)):g}, on which Pearson and Spearman are "
                    "undefined (any model would score 0); give examples with different scores"
                )

    def label_value(self, label: Any, index: dict[str, int]) -> Any:
        return float(label)

    def decide(self, meta: Meta, logits: list[Tensor]) -> tuple[list[Any], list[float]]:
        """The score, twice (it is its own confidence)."""
        scores = [float(row[0]) for row in logits]
        return scores, list(scores)

    def scored(self, meta: Meta, examples: list[Any], preds: list[Any]) -> tuple[list[Any], list[Any]]:
        return preds, [float(ex.label) for ex in examples]

    def format(self, meta: Meta, example: Any, pred: Any, prob: float) -> str:
        return f"{pred:.6g}\n"
