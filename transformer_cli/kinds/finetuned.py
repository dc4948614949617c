"""What training and inference share about a fine-tuned BERT: its checkpoint metadata (task kind, labels,
encoder sizes, tokenizer), the model it describes, examples -> padded batches, and predictions.

`tcli finetune` writes with it; `predict`, `evaluate`, `export-hf` and `count-params` read with it. Nothing
here imports the training modules.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from transformer_cli.config import BertModelConfig
from transformer_cli.core.buckets import bucket
from transformer_cli.core.errors import UserError, finite_number
from transformer_cli.data.labeled import invisible
from transformer_cli.metrics import task_metrics
from transformer_cli.models.losses import IGNORE
from transformer_cli.vocab.bert_tokenizer import BertTokenizer, pack

if TYPE_CHECKING:
    from transformer_cli.runtime.device import Runtime

# ----------------------------------------------------------------------------- the checkpoint's metadata


@dataclass
class FinetuneMeta:
    """Stored in every fine-tuned checkpoint under "finetune"."""

    kind: str  # classification | regression | tagging
    labels: list[str]  # the label set, in id order (empty for regression)
    encoder: BertModelConfig  # resolved sizes of the encoder
    vocab_size: int  # rows of the token embedding (an HF model may have more than its tokenizer's tokens)
    tokenizer: BertTokenizer
    max_seq_len: int
    classifier_dropout: float = 0.1

    @property
    def outputs(self) -> int:
        return 1 if self.kind == "regression" else len(self.labels)

    def state(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "labels": list(self.labels),
            "encoder": self.encoder.model_dump(mode="json"),
            "vocab_size": self.vocab_size,
            "tokenizer": self.tokenizer.state(),
            "max_seq_len": self.max_seq_len,
            "classifier_dropout": self.classifier_dropout,
        }

    @classmethod
    def from_state(cls, state: Any, source: str) -> FinetuneMeta:
        if not isinstance(state, dict) or state.get("kind") not in ("classification", "regression", "tagging"):
            raise UserError(f"{source}: the fine-tuning metadata is missing or damaged")
        labels = state.get("labels")
        fewest = {"classification": 2, "regression": 0, "tagging": 1}[state["kind"]]  # as training has them
        if (
            not isinstance(labels, list)
            or not all(isinstance(x, str) for x in labels)
            or len(set(labels)) != len(labels)
            or any(invisible(label) for label in labels)  # as training refuses them
            or not fewest <= len(labels) <= (0 if state["kind"] == "regression" else 10**6)
        ):
            raise UserError(f"{source}: the stored label set of its {state['kind']} head is damaged")
        from transformer_cli.config import build_config

        encoder = build_config(BertModelConfig, state.get("encoder") or {}, f"the encoder config stored in {source}")
        tokenizer = BertTokenizer.from_state(state.get("tokenizer"), source)
        vocab_size = _stored(state, "vocab_size", len(tokenizer), int, len(tokenizer), 10**8, source)
        max_seq_len = _stored(state, "max_seq_len", 128, int, 8, encoder.max_positions, source)
        dropout = _stored(state, "classifier_dropout", 0.1, float, 0.0, 0.999, source)
        return cls(state["kind"], labels, encoder, vocab_size, tokenizer, max_seq_len, dropout)


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
    from transformer_cli.models.heads import BertClassifier

    e = meta.encoder
    if e.d_model % e.heads:
        raise ValueError(f"d_model ({e.d_model}) must be divisible by heads ({e.heads})")
    encoder = build_bert(e, meta.vocab_size, pad_id=meta.tokenizer.pad_id, pretraining_heads=False)
    return BertClassifier(encoder, meta.kind, meta.outputs, meta.classifier_dropout)


# ----------------------------------------------------------------------------- examples -> features


@dataclass
class Features:
    """Encoded examples: ids and token types per example, its label (a class id, a float, or per-position tags
    with IGNORE), and, for tagging, the position of each word's first piece."""

    ids: list[list[int]] = field(default_factory=list)
    types: list[list[int]] = field(default_factory=list)
    labels: list[Any] = field(default_factory=list)
    first_pieces: list[list[int]] = field(default_factory=list)
    truncated: int = 0  # examples cut to max_seq_len
    words_lost: int = 0  # tagging: words cut off with them (predicted as the first label, scored as wrong)

    def __len__(self) -> int:
        return len(self.ids)


def encode_texts(
    tokenizer: BertTokenizer,
    texts: Sequence[str],
    pairs: Sequence[str] | None,
    labels: Sequence[Any] | None,
    max_len: int,
) -> Features:
    """`[CLS] a [SEP] (b [SEP])` for each example, cut to `max_len` (longest side first)."""
    a_ids = tokenizer.encode(list(texts))
    b_ids = tokenizer.encode(list(pairs)) if pairs is not None else [None] * len(a_ids)
    out = Features()
    for i, (a, b) in enumerate(zip(a_ids, b_ids)):
        ids, types, cut = pack(a, b, max_len, tokenizer.cls_id, tokenizer.sep_id)
        out.ids.append(ids)
        out.types.append(types)
        out.labels.append(labels[i] if labels is not None else None)
        out.truncated += cut
    return out


def encode_tagged(
    tokenizer: BertTokenizer, sentences: Sequence[Sequence[str]], tags: Sequence[Sequence[int]] | None, max_len: int
) -> Features:
    """`[CLS] pieces [SEP]` for each sentence; a word's tag sits at its first piece, IGNORE elsewhere."""
    out = Features()
    for i, words in enumerate(sentences):
        ids, labels, firsts = [tokenizer.cls_id], [IGNORE], []
        for j, pieces in enumerate(tokenizer.encode_words(list(words))):
            if len(ids) + len(pieces) > max_len - 1:
                pieces = pieces[: max(0, max_len - 1 - len(ids))]
                if not pieces:
                    break
            firsts.append(len(ids))
            ids += pieces
            labels += [tags[i][j] if tags is not None else IGNORE] + [IGNORE] * (len(pieces) - 1)
        if len(firsts) < len(words) or len(ids) + 1 > max_len:
            out.truncated += 1
            out.words_lost += len(words) - len(firsts)
        ids, labels = ids[: max_len - 1] + [tokenizer.sep_id], labels[: max_len - 1] + [IGNORE]
        out.ids.append(ids)
        out.types.append([0] * len(ids))
        out.labels.append(labels)
        out.first_pieces.append(firsts)
    return out


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
        items = ids.size(0) if labels is None or labels.dim() == 1 else int(labels.ne(IGNORE).sum())
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
    """Rows of `features` padded to the longest of them (or to `length`)."""
    T = length or max(len(features.ids[r]) for r in rows)
    ids = torch.full((len(rows), T), pad_id, dtype=torch.long)
    types = torch.zeros((len(rows), T), dtype=torch.long)
    tagged = kind == "tagging"
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
        labels = torch.tensor(values, dtype=torch.float32 if kind == "regression" else torch.long)
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
    """The float32 logits of every example, in the examples' order: (C,), (1,) or, for tagging, (words, C).
    Each batch is padded to `batch_width(its longest, 1, limit, ...)`, the widths training takes."""
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
            out[r] = logits[i, features.first_pieces[r]] if kind == "tagging" else logits[i]
    model.train(was_training)
    return out  # type: ignore[return-value]


def decide(kind: str, logits: list[Tensor]) -> tuple[list[Any], list[float]]:
    """(predictions, confidence): class ids and their softmax probability; the regression score (twice);
    for tagging, per-word tag ids and the sentence's mean probability."""
    preds: list[Any] = []
    probs: list[float] = []
    for row in logits:
        if kind == "regression":
            preds.append(float(row[0]))
            probs.append(float(row[0]))
        elif kind == "tagging":
            p = row.softmax(-1)
            preds.append(p.argmax(-1).tolist())
            probs.append(float(p.max(-1).values.mean()) if p.numel() else 1.0)
        else:
            p = row.softmax(-1)
            preds.append(int(p.argmax()))
            probs.append(float(p.max()))
    return preds, probs


# ----------------------------------------------------------------------------- scoring (training and tcli evaluate)

EVAL_ROWS = 64  # examples per evaluation batch (length-sorted: little padding)


def features_of(meta: FinetuneMeta, examples: list[Any]) -> Features:
    """Examples (with labels as ids, floats or tag ids) -> encoded features under the model's tokenizer."""
    index = {label: i for i, label in enumerate(meta.labels)}
    if meta.kind == "tagging":
        sentences = [ex.words for ex in examples]
        tagged = all(ex.tags is not None for ex in examples)
        tags = [[index[t] for t in ex.tags] for ex in examples] if tagged else None
        return encode_tagged(meta.tokenizer, sentences, tags, meta.max_seq_len)
    pairs = [ex.pair or "" for ex in examples] if any(ex.pair is not None for ex in examples) else None
    labelled = all(ex.label is not None for ex in examples)
    labels = None
    if labelled:
        labels = [float(ex.label) if meta.kind == "regression" else index[ex.label] for ex in examples]
    return encode_texts(meta.tokenizer, [ex.text for ex in examples], pairs, labels, meta.max_seq_len)


def score(meta: FinetuneMeta, metrics: Sequence[str], examples: list[Any], preds: list[Any]) -> dict[str, float]:
    """The task's metrics of predictions (ids, floats or tag-id lists) against the examples' labels, and
    "score": their mean (GLUE's score of a task), which selects best.pt."""
    if meta.kind == "tagging":
        gold = [list(ex.tags) for ex in examples]
        pred = [[meta.labels[i] for i in p] + ["O"] * (len(g) - len(p)) for p, g in zip(preds, gold)]
    elif meta.kind == "regression":
        gold, pred = [float(ex.label) for ex in examples], preds
    else:
        index = {label: i for i, label in enumerate(meta.labels)}
        gold, pred = [index[ex.label] for ex in examples], preds
    results = task_metrics.compute(metrics, pred, gold)
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
) -> tuple[dict[str, float], list[Any]]:
    """(the metrics and score, the predictions) of labelled examples: what training logs at each evaluation
    and `tcli evaluate` prints, computed by this one function. Outputs that are not finite (weights grown past
    float range) score NaN, which never becomes best.pt (argmax read NaN as class 0: a score of chance); with
    `refuse_non_finite` (the checkpoint's name) they are a one-line error."""
    features = features if features is not None else features_of(meta, examples)
    batches = length_order(features, EVAL_ROWS)
    logits = predict_logits(model, features, batches, meta.tokenizer.pad_id, meta.kind, runtime, meta.max_seq_len)
    preds, _ = decide(meta.kind, logits)
    if non_finite(logits, refuse_non_finite):
        return {**dict.fromkeys(metrics, math.nan), "score": math.nan}, preds
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


# the Hugging Face class that holds a model of each kind (export-hf, count-params)
HF_CLASSES = {
    "classification": "BertForSequenceClassification",
    "regression": "BertForSequenceClassification",
    "tagging": "BertForTokenClassification",
}
