"""What a kind of fine-tuning task is: the one place that says how its labels are read, what its features and
head are, how its logits become predictions, how those are scored, printed and exported.

`Kind` holds the behaviour of a label per text (or pair), which most kinds share; each kind is a subclass in its
own module (classification.py, regression.py, tagging.py, multilabel.py, span.py), registered in registry.KINDS. Its
name, metrics and the files it reads are core/kinds.TASK_KINDS' (config.py checks a config with them, below this
folder).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar, Protocol

import torch
from torch import Tensor

from transformer_cli.core.kinds import TASK_KINDS
from transformer_cli.kinds.features import Features, encode_texts
from transformer_cli.vocab.bert_tokenizer import BertTokenizer


class Meta(Protocol):
    """What a kind reads of a fine-tuned model's metadata (finetuned.Meta, which names its kind)."""

    labels: list[str]
    tokenizer: BertTokenizer
    max_seq_len: int
    threshold: float  # of a kind that decides each label by its probability (multilabel)


class Kind:
    """A kind of fine-tuning task. Subclasses set the class attributes and override what differs."""

    name: ClassVar[str]
    # How data/labeled.py reads a row's label: "classification" (a class name) or "regression" (a number).
    label_form: ClassVar[str] = "classification"
    per_token: ClassVar[bool] = False  # the head reads every position (a tag per word), else the pooled [CLS]
    loss: ClassVar[str] = "cross_entropy"  # models/heads.LOSSES
    label_dtype: ClassVar[torch.dtype] = torch.long  # of a batch's labels
    has_label_set: ClassVar[bool] = True  # labels are names fixed by training (their positions are the ids)
    fewest_labels: ClassVar[int] = 2  # bounds of a stored label set, as training makes them
    most_labels: ClassVar[int] = 10**6
    hf_class: ClassVar[str] = "BertForSequenceClassification"  # the Hugging Face class that holds the model
    problem_type: ClassVar[str | None] = "single_label_classification"  # its config.json problem_type

    @property
    def metrics(self) -> tuple[str, ...]:
        return TASK_KINDS[self.name].metrics

    @property
    def default_metrics(self) -> tuple[str, ...]:
        return TASK_KINDS[self.name].default_metrics

    @property
    def reads(self) -> str:
        return TASK_KINDS[self.name].reads

    @property
    def thresholded(self) -> bool:
        return TASK_KINDS[self.name].thresholded

    def outputs(self, labels: Sequence[str]) -> int:
        """The head's outputs for a label set."""
        return len(labels)

    def hf_labels(self, labels: Sequence[str]) -> list[str]:
        """id2label of the exported config.json."""
        return list(labels)

    def describe_outputs(self, labels: Sequence[str]) -> str:
        return f"{len(labels)} labels"

    def settings_of(self, cfg: Any, data: Any) -> Any:
        """The kind's own settings from a run's config and data (FinetuneMeta.settings, in the checkpoint), or
        None: most kinds have none."""
        return None

    def read_settings(self, state: Any, source: str) -> Any:
        """The settings stored in a checkpoint (`settings_of`'s, as `.state()` gave them)."""
        return None

    def head(self, encoder: Any, outputs: int, dropout: float) -> torch.nn.Module:
        """The model: the encoder (models/bert.Bert) and this kind's head."""
        from transformer_cli.models.heads import BertClassifier

        return BertClassifier(encoder, outputs, dropout, per_token=self.per_token, loss=self.loss)

    # ------------------------------------------------------------------------- training data

    def check_label_set(self, labels: Sequence[str], path: Path) -> None:
        """The label set training found in `path`: a UserError when the head cannot learn from it."""

    def label_warnings(self, labels: Sequence[str], path: Path) -> list[str]:
        """Warnings about the label set training found in `path` (printed, the run goes on)."""
        return []

    def check_scorable(self, metrics: Sequence[str], dev: dict[Path | str, list[Any]]) -> None:
        """A UserError for a dev set (or a file tcli evaluate scores) on which a chosen metric is the same for
        every model: best.pt would be chosen on that constant, and evaluate would print it as a score."""

    # ------------------------------------------------------------------------- features and batches

    def label_value(self, label: Any, index: dict[str, int]) -> Any:
        """What a batch holds of one example's label (`index`: label -> id)."""
        return index[label]

    def features(self, meta: Meta, examples: list[Any]) -> Features:
        """Examples -> features under the model's tokenizer; with labels when every example has one."""
        index = {label: i for i, label in enumerate(meta.labels)}
        pairs = [ex.pair or "" for ex in examples] if any(ex.pair is not None for ex in examples) else None
        labels = None
        if all(ex.label is not None for ex in examples):
            labels = [self.label_value(ex.label, index) for ex in examples]
        return encode_texts(meta.tokenizer, [ex.text for ex in examples], pairs, labels, meta.max_seq_len)

    def collate(self, features: Any, rows: Sequence[int], pad_id: int, length: int | None) -> Any:
        """A batch of the kind's own form, or None for finetuned.collate's ClassifierBatch."""
        return None

    def describe_features(self, meta: Meta, split: str, examples: list[Any], features: Features) -> str:
        """The training log's line about a split's encoded examples."""
        cut = f"; {features.truncated:,} cut to max_seq_len {meta.max_seq_len}" if features.truncated else ""
        lost = f" ({features.words_lost:,} words lost)" if features.words_lost else ""
        return f"{split}: {len(features):,} examples{cut}{lost}"

    # ------------------------------------------------------------------------- predictions

    def decide_examples(
        self, meta: Meta, examples: list[Any], features: Any, logits: list[Tensor]
    ) -> tuple[list[Any], list[float]]:
        """(predictions, confidence) of the examples, from the logits of their features: `decide`'s, for the
        kinds whose features are their examples one to one."""
        return self.decide(meta, logits)

    def score(
        self, meta: Meta, metrics: Sequence[str], examples: list[Any], preds: list[Any]
    ) -> dict[str, float] | None:
        """The kind's own metrics of predictions, or None for task_metrics.compute over `scored`."""
        return None

    def decide(self, meta: Meta, logits: list[Tensor]) -> tuple[list[Any], list[float]]:
        """(predictions, confidence) of each example's logits: the class id and its softmax probability."""
        preds: list[Any] = []
        probs: list[float] = []
        for row in logits:
            p = row.softmax(-1)
            preds.append(int(p.argmax()))
            probs.append(float(p.max()))
        return preds, probs

    def scored(self, meta: Meta, examples: list[Any], preds: list[Any]) -> tuple[list[Any], list[Any]]:
        """(predictions, gold) as metrics/task_metrics.compute takes them."""
        index = {label: i for i, label in enumerate(meta.labels)}
        return preds, [index[ex.label] for ex in examples]

    def tuned_threshold(self, meta: Meta, metrics: Sequence[str], examples: list[Any], logits: list[Tensor]) -> float:
        """The decision threshold that scores best on `examples` (kinds decided by one: core/kinds thresholded)."""
        raise NotImplementedError(f"{self.name} decides without a threshold")

    def note(self, meta: Meta, preds: list[Any], split: str) -> str | None:
        """A line for the training log about a dev evaluation's predictions, or None."""
        return None

    def warnings(self, meta: Meta, examples: list[Any], preds: list[Any]) -> list[str]:
        """What `tcli predict` says on stderr about a chunk's predictions."""
        return []

    def format(self, meta: Meta, example: Any, pred: Any, prob: float) -> str:
        """`tcli predict`'s output for one example: `label<TAB>probability`."""
        return f"{meta.labels[pred]}\t{prob:.4f}\n"
