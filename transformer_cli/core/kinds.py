"""The names of the fine-tuning task kinds, and what a config needs to know of each before anything is read.

Each kind's behaviour (how it reads labels, builds features, which head and loss, how it decides, its HF class)
lives in its own module, `transformer_cli/kinds/<name>.py`, registered in `kinds.registry.KINDS`. This table
sits low because config.py, below the kinds folder, validates `task.kind` and `task.metrics` with it;
tests/kinds/test_registry.py holds it equal to the registry.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class KindNames:
    """What config.py checks of a task kind."""

    metrics: tuple[str, ...]  # the metrics (metrics/task_metrics.METRICS names) that score its predictions
    default_metrics: tuple[str, ...]  # task.metrics when the config leaves it out; their mean selects best.pt
    # "table" (TSV, CSV, JSONL rows with named columns), "conll" (a word and its tag per line) or "squad" (questions
    # on contexts with answer spans: SQuAD JSON, or JSON lines)
    reads: str
    thresholded: bool = False  # decides each label by a probability threshold (task.threshold)


_ENTITY = ("entity_f1", "entity_precision", "entity_recall")

TASK_KINDS: dict[str, KindNames] = {
    "classification": KindNames(("accuracy", "f1", "mcc"), ("accuracy",), "table"),
    "regression": KindNames(("pearson", "spearman"), ("pearson", "spearman"), "table"),
    "tagging": KindNames(_ENTITY, _ENTITY, "conll"),
    "multilabel": KindNames(("macro_f1", "micro_f1", "subset_accuracy"), ("macro_f1",), "table", thresholded=True),
    "span": KindNames(("exact_match", "f1"), ("f1",), "squad"),  # SQuAD's, in percent (metrics/squad.py)
}
