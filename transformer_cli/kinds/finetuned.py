"""What training and inference share about a fine-tuned BERT: its checkpoint metadata (task kind, labels,
encoder sizes, tokenizer), the model it describes, examples -> padded batches, and predictions.

`tcli finetune` writes with it; `predict`, `evaluate`, `export-hf` and `count-params` read with it. Nothing
here imports the training modules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from transformer_cli.config import BertModelConfig
from transformer_cli.core.buckets import bucket
from transformer_cli.core.errors import UserError, finite_number
from transformer_cli.data.labeled import invisible
from transformer_cli.kinds.base import Kind
from transformer_cli.kinds.features import Features, encode_tagged, encode_texts
from transformer_cli.kinds.registry import KINDS
from transformer_cli.metrics import task_metrics
from transformer_cli.models.losses import IGNORE
from transformer_cli.vocab.bert_tokenizer import BertTokenizer

__all__ = ["Features", "encode_tagged", "encode_texts"]  # (their home is features.py; read from here too)

if TYPE_CHECKING:
    from transformer_cli.runtime.device import Runtime

# ----------------------------------------------------------------------------- the checkpoint's metadata


@dataclass
class FinetuneMeta:
    """Stored in every fine-tuned checkpoint under "finetune"."""

    kind: str  # a name of registry.KINDS: classification | regression | tagging | multilabel
    labels: list[str]  # the label set, in id order (empty for regression)
    encoder: BertModelConfig  # resolved sizes of the encoder
    vocab_size: int  # rows of the token embedding (an HF model may have more than its tokenizer's tokens)
    tokenizer: BertTokenizer
    max_seq_len: int
    classifier_dropout: float = 0.1
    settings: Any = None  # the kind's own (Kind.settings_of: span's windows and decoding), stored as "settings"
    threshold: float = 0.5  # multilabel: a label is predicted above this probability (tuned on dev, or task.threshold)

    @property
    def task_kind(self) -> Kind:
        """The kind's behaviour (kinds/<kind>.py)."""
        return KINDS[self.kind]

    @property
    def outputs(self) -> int:
        return self.task_kind.outputs(self.labels)

    def state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "labels": list(self.labels),
            "encoder": self.encoder.model_dump(mode="json"),
            "vocab_size": self.vocab_size,
            "tokenizer": self.tokenizer.state(),
            "max_seq_len": self.max_seq_len,
            "classifier_dropout": self.classifier_dropout,
            **({"settings": self.settings.state()} if self.settings is not None else {}),
            **({"threshold": self.threshold} if self.task_kind.thresholded else {}),
        }

    @classmethod
    def from_state(cls, state: Any, source: str) -> FinetuneMeta:
        if not isinstance(state, dict) or not isinstance(state.get("kind"), str) or state["kind"] not in KINDS:
            raise UserError(f"{source}: the fine-tuning metadata is missing or damaged")
        labels = state.get("labels")
        kind = KINDS[state["kind"]]
        if (
            not isinstance(labels, list)
            or not all(isinstance(x, str) for x in labels)
            or len(set(labels)) != len(labels)
            or any(invisible(label) for label in labels)  # as training refuses them
            or not kind.fewest_labels <= len(labels) <= kind.most_labels  # as training has them
        ):
            raise UserError(f"{source}: the stored label set of its {state['kind']} head is damaged")
        from transformer_cli.config import build_config

        encoder = build_config(BertModelConfig, state.get("encoder") or {}, f"the encoder config stored in {source}")
        tokenizer = BertTokenizer.from_state(state.get("tokenizer"), source)
        vocab_size = _stored(state, "vocab_size", len(tokenizer), int, len(tokenizer), 10**8, source)
        max_seq_len = _stored(state, "max_seq_len", 128, int, 8, encoder.max_positions, source)
        dropout = _stored(state, "classifier_dropout", 0.1, float, 0.0, 0.999, source)
        settings = kind.read_settings(state.get("settings"), source)
        threshold = _stored(state, "threshold", 0.5, float, 1e-6, 1 - 1e-6, source) if kind.thresholded else 0.5
        meta = cls(state["kind"], labels, encoder, vocab_size, tokenizer, max_seq_len, dropout, settings=settings)
        meta.threshold = threshold
        return meta


def _stored(state: dict, key: str, default: Any, kind: type, low: float, high: float, source: str) -> Any:
    """A number of the fine-tuning metadata, of its type and inside its bounds (max_seq_len 0 crashed the packing,
    one above the encoder's positions its embedding); one line naming the key otherwise."""
    value = state.get(key, default)
    if not (finite_number(value) and (kind is float or isinstance(value, int)) and low <= value <= high):
        raise UserError(
            f"{source}: the stored {key} ({value!r}) is damaged: it should be a number from {low:g} to {high:g}; "
            "use another checkpoint"
        )
    return kind(value)


def build_classifier(meta: FinetuneMeta) -> nn.Module:
    """The encoder (without pretraining heads) and the task's head, from the metadata alone."""
    from transformer_cli.models.builders import build_bert

    e = meta.encoder
    if e.d_model % e.heads:
        raise ValueError(f"d_model ({e.d_model}) must be divisible by heads ({e.heads})")
    encoder = build_bert(e, meta.vocab_size, pad_id=meta.tokenizer.pad_id, pretraining_heads=False)
    return meta.task_kind.head(encoder, meta.outputs, meta.classifier_dropout)


# ----------------------------------------------------------------------------- batches


@dataclass
class ClassifierBatch:
    input_ids: Tensor  # (B, T)
    segment_ids: Tensor  # (B, T)
    labels: Tensor | None  # (B,) or (B, T)
    items: int  # labelled items: sequences, or first pieces for tagging
    real_tokens: int

    @property
    def counts(self) -> dict[str, int]:
        return {"items": self.items}

    @property
    def throughput_tokens(self) -> int:
        return self.real_tokens

    @property
    def rows(self) -> int:
        return self.input_ids.size(0)

    def shard(self, rank: int, world: int) -> ClassifierBatch | None:
        """Rows rank, rank + world, ... of a global batch; None if there are none."""
        if world == 1:
            return self
        ids = self.input_ids[rank::world]
        if ids.size(0) == 0:
            return None
        labels = self.labels[rank::world] if self.labels is not None else None
        per_position = labels is not None and labels.dim() == 2 and not labels.is_floating_point()  # (B, T) tags
        items = int(labels.ne(IGNORE).sum()) if per_position else ids.size(0)  # (multi-label: (B, C) floats)
        return ClassifierBatch(ids, self.segment_ids[rank::world], labels, items, int(ids.ne(0).sum()))

    def to(self, device: torch.device) -> ClassifierBatch:
        nb = device.type == "cuda"
        labels = self.labels.to(device, non_blocking=nb) if self.labels is not None else None
        return ClassifierBatch(
            self.input_ids.to(device, non_blocking=nb),
            self.segment_ids.to(device, non_blocking=nb),
            labels,
            self.items,
            self.real_tokens,
        )


def collate(
    features: Features, rows: Sequence[int], pad_id: int, kind: str, length: int | None = None
) -> ClassifierBatch:
    """Rows of `features` padded to the longest of them (or to `length`); `kind` names the task's kind (whose
    own batches, if it has them, are its `Kind.collate`'s)."""
    own = KINDS[kind].collate(features, rows, pad_id, length)
    if own is not None:
        return own
    T = length or max(len(features.ids[r]) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    types = torch.zeros((len(rows), T), dtype=torch.long)
    tagged = KINDS[kind].per_token
    labels = torch.full((len(rows), T), IGNORE, dtype=torch.long) if tagged else None
    values: list[Any] = []
    for i, r in enumerate(rows):
        n = len(features.ids[r])
        ids[i, :n] = torch.tensor(features.ids[r])
        types[i, :n] = torch.tensor(features.types[r])
        if tagged:
            labels[i, :n] = torch.tensor(features.labels[r])
        else:
            values.append(features.labels[r])
    if not tagged and values and values[0] is not None:
        labels = torch.tensor(values, dtype=KINDS[kind].label_dtype)
    items = int(labels.ne(IGNORE).sum()) if tagged else len(rows)
    return ClassifierBatch(ids, types, labels, items, int(sum(len(features.ids[r]) for r in rows)))


def batch_width(longest: int, multiple: int, limit: int, bucketed: bool) -> int:
    """The width a batch whose longest member has `longest` pieces is padded to: the next multiple of `multiple`,
    or, `bucketed`, `bucket(longest, multiple)`, one of 8 sizes per doubling (at most 12.5% more); never beyond
    `limit` (max_seq_len) but for a longest member already there.

    Bucketed where matmuls compile a kernel per shape (`Runtime.kernel_per_shape`: bf16 on a CPU): with exact
    widths, fine-tuning on MRPC meets more kernels than oneDNN's cache holds and compiles many of them again at
    every epoch; elsewhere the padding would only cost (measured: docs/benchmarks/finetuning.md)."""
    width = bucket(longest, multiple) if bucketed else -(-longest // multiple) * multiple
    return max(longest, min(width, limit))


def length_order(features: Features, max_tokens_rows: int) -> list[list[int]]:
    """Inference batches of `max_tokens_rows` rows in length order (little padding), no shuffling."""
    order = sorted(range(len(features)), key=lambda i: len(features.ids[i]))
    return [order[i : i + max_tokens_rows] for i in range(0, len(order), max_tokens_rows)]


# ----------------------------------------------------------------------------- predictions


@torch.inference_mode()
def predict_logits(
    model: nn.Module,
    features: Features,
    batches: Iterable[list[int]],
    pad_id: int,
    kind: str,
    runtime: Runtime,
    limit: int,
) -> list[Tensor]:
    """The float32 logits of every example, in the examples' order: (C,), (1,) or, for tagging, (words, C)
    (for span, every window's (T, 2)).
    Each batch is padded to `batch_width(its longest, 1, limit, ...)`, the widths training takes."""
    per_token = KINDS[kind].per_token
    was_training = model.training
    model.eval()
    out: list[Tensor | None] = [None] * len(features)
    for rows in batches:
        width = batch_width(max(len(features.ids[r]) for r in rows), 1, limit, runtime.kernel_per_shape)
        batch = collate(features, rows, pad_id, kind, width)
        with runtime.context():
            logits = model(batch.input_ids.to(runtime.device), batch.segment_ids.to(runtime.device))
        logits = logits.float().cpu()
        for i, r in enumerate(rows):
            out[r] = logits[i, features.first_pieces[r]] if per_token else logits[i]
    model.train(was_training)
    return out  # type: ignore[return-value]


def decide(
    meta: FinetuneMeta, logits: list[Tensor], examples: list[Any], features: Features
) -> tuple[list[Any], list[float]]:
    """(predictions, confidence) of each example from its features' logits, as the kind decides
    (`Kind.decide_examples`)."""
    return meta.task_kind.decide_examples(meta, examples, features, logits)


# ----------------------------------------------------------------------------- scoring (training and tcli evaluate)

EVAL_ROWS = 64  # examples per evaluation batch (length-sorted: little padding)


def features_of(meta: FinetuneMeta, examples: list[Any]) -> Features:
    """Examples -> encoded features under the model's tokenizer (labels as the kind keeps them: ids, floats or
    tag ids), with labels when every example has one."""
    return meta.task_kind.features(meta, examples)


def score(meta: FinetuneMeta, metrics: Sequence[str], examples: list[Any], preds: list[Any]) -> dict[str, float]:
    """The task's metrics of predictions (ids, floats or tag-id lists) against the examples' labels, and
    "score": their mean (GLUE's score of a task), which selects best.pt."""
    results = meta.task_kind.score(meta, metrics, examples, preds)
    if results is None:
        pred, gold = meta.task_kind.scored(meta, examples, preds)
        results = task_metrics.compute(metrics, pred, gold, meta.labels)
    results["score"] = task_metrics.main_value(results, metrics)
    return results


def evaluate_examples(
    model: nn.Module,
    meta: FinetuneMeta,
    metrics: Sequence[str],
    examples: list[Any],
    features: Features | None,
    runtime: Runtime,
    refuse_non_finite: str | None = None,
    tune: bool = False,
) -> tuple[dict[str, float], list[Any]]:
    """(the metrics and score, the predictions) of labelled examples: what training logs at each evaluation
    and `tcli evaluate` prints, computed by this one function. Outputs that are not finite (weights grown past
    float range) score NaN, which never becomes best.pt (argmax read NaN as class 0: a score of chance); with
    `refuse_non_finite` (the checkpoint's name) they are a one-line error. With `tune`, the kind's decision
    threshold is first set (in `meta`) to the one that scores best on these examples (`Kind.tuned_threshold`)."""
    features = features if features is not None else features_of(meta, examples)
    batches = length_order(features, EVAL_ROWS)
    logits = predict_logits(model, features, batches, meta.tokenizer.pad_id, meta.kind, runtime, meta.max_seq_len)
    if non_finite(logits, refuse_non_finite):
        return {**dict.fromkeys(metrics, math.nan), "score": math.nan}, decide(meta, logits, examples, features)[0]
    if tune:
        meta.threshold = meta.task_kind.tuned_threshold(meta, metrics, examples, logits)
    preds, _ = decide(meta, logits, examples, features)
    return score(meta, metrics, examples, preds), preds


def non_finite(logits: list[Tensor], refuse: str | None = None) -> int:
    """How many examples' outputs hold NaN or inf; with `refuse` (the checkpoint's name) any is a UserError."""
    bad = sum(not bool(torch.isfinite(t).all()) for t in logits)
    if bad and refuse is not None:
        raise UserError(
            f"{refuse}: the model's outputs are not finite (NaN or inf) for {bad} of {len(logits)} examples (its "
            "weights grew past the float range while it trained); use an earlier checkpoint of the run"
        )
    return bad
