"""Fine-tuning metrics with GLUE's exact definitions, and the GLUE score and table.

Classification: `accuracy`, `f1_positive` (F1 of the positive class: MRPC, QQP), `matthews` (MCC, sklearn's
multiclass generalisation: CoLA). Regression: `pearson`, `spearman` (average ranks for ties: STS-B).
Tagging: `entity_scores`, conlleval's entity-level precision/recall/F1 (IOB1 and IOB2 alike, per-type F1 too).
Multi-label: `multilabel_scores` on indicator matrices (a row per example, a column per label): `micro_f1`
(TP, FP, FN summed over labels), `macro_f1` (the mean of each label's F1, 0 for a label never gold nor
predicted, as sklearn's zero_division=0), `subset_accuracy` (rows predicted exactly), and F1 per label.
`compute` runs metrics by name, `main_value` is a task's score (the mean of its metrics, as GLUE counts a
two-metric task), `glue_score` the mean over tasks (MNLI's matched and mismatched averaged into one task) and
`glue_table` the Markdown table `tcli glue` prints. Scores are fractions in 0..1; only the table shows x100.
Undefined correlations (a constant side) are 0.0, never nan, so that a mean over tasks stays a number.
Only numpy: no torch, and sklearn/scipy/seqeval are used by the tests alone, as independent checks.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from transformer_cli.core.kinds import TASK_KINDS

_ENTITY = ("entity_f1", "entity_precision", "entity_recall")
_MULTILABEL = ("macro_f1", "micro_f1", "subset_accuracy")
# exact_match (and f1 for extractive QA) are SQuAD's, computed by metrics/squad.py (kinds/span.py scores with it)
METRICS = ("accuracy", "f1", "mcc", "pearson", "spearman", *_ENTITY, *_MULTILABEL, "exact_match")
# The metrics that score each kind of task's predictions (label ids, numbers, sentences of tags): core/kinds.py's.
BY_KIND = {name: kind.metrics for name, kind in TASK_KINDS.items()}


def _pair(pred: Sequence, gold: Sequence, dtype: type) -> tuple[np.ndarray, np.ndarray]:
    p, g = np.asarray(pred, dtype=dtype), np.asarray(gold, dtype=dtype)
    if p.shape != g.shape or p.ndim != 1:
        raise ValueError(f"pred and gold must be two sequences of the same length, not {p.shape} and {g.shape}")
    if p.size == 0:
        raise ValueError("no predictions to score")
    return p, g


def accuracy(pred: Sequence[int], gold: Sequence[int]) -> float:
    """The fraction of predictions equal to the gold label."""
    p, g = _pair(pred, gold, np.int64)
    return float(np.mean(p == g))


def f1_positive(pred: Sequence[int], gold: Sequence[int], positive: int = 1) -> float:
    """F1 of the positive class (GLUE's F1 for MRPC and QQP); 0.0 when there is no true positive."""
    p, g = _pair(pred, gold, np.int64)
    tp = int(np.sum((p == positive) & (g == positive)))
    fp = int(np.sum((p == positive) & (g != positive)))
    fn = int(np.sum((p != positive) & (g == positive)))
    return 0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn)


def matthews(pred: Sequence[int], gold: Sequence[int]) -> float:
    """Matthews correlation coefficient, binary or multiclass (Gorodkin's R_K, as sklearn's matthews_corrcoef).

    0.0 when undefined (all predictions, or all gold labels, in one class).
    """
    p, g = _pair(pred, gold, np.int64)
    classes, inv = np.unique(np.concatenate([p, g]), return_inverse=True)
    k, n = len(classes), len(p)
    confusion = np.zeros((k, k), dtype=np.float64)
    np.add.at(confusion, (inv[n:], inv[:n]), 1.0)  # rows gold, columns predicted
    t, q = confusion.sum(axis=1), confusion.sum(axis=0)
    correct, s = np.trace(confusion), float(n)
    # float64 throughout: s**2 * s**2 overflows int64 past ~55k examples.
    denominator = np.sqrt((s * s - q @ q) * (s * s - t @ t))
    return 0.0 if denominator == 0 else float((correct * s - t @ q) / denominator)


def _correlation(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    denominator = np.sqrt((x @ x) * (y @ y))
    if denominator == 0:
        return 0.0
    return float(np.clip((x @ y) / denominator, -1.0, 1.0))


def pearson(pred: Sequence[float], gold: Sequence[float]) -> float:
    """Pearson's r. 0.0 when either side is constant (scipy gives nan; a nan would poison the GLUE mean)."""
    p, g = _pair(pred, gold, np.float64)
    return _correlation(p, g)


def _ranks(x: np.ndarray) -> np.ndarray:
    """1-based ranks, ties sharing the average of their ranks (scipy.stats.rankdata's 'average')."""
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])  # first index of each run of ties
    ends = np.r_[starts[1:], len(x)]
    average = (starts + ends + 1) / 2.0  # mean of ranks starts+1 .. ends
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.repeat(average, ends - starts)
    return ranks


def spearman(pred: Sequence[float], gold: Sequence[float]) -> float:
    """Spearman's rho: Pearson's r of the ranks, ties given average ranks. 0.0 when either side is constant."""
    p, g = _pair(pred, gold, np.float64)
    return _correlation(_ranks(p), _ranks(g))


def _split_tag(tag: str) -> tuple[str, str]:
    """("B", "PER") for "B-PER"; ("O", "") for "O"; a tag without "-" is its own prefix, with no type."""
    if tag == "O":
        return "O", ""
    prefix, _, kind = tag.partition("-")
    return prefix, kind


def _chunk_ends(prev: str, prev_type: str, tag: str, kind: str) -> bool:
    """conlleval's endOfChunk: whether a chunk ended at the previous token."""
    if prev in ("B", "I") and tag in ("B", "O", "S"):
        return True
    if prev in ("E", "S"):
        return True
    return prev != "O" and prev_type != kind


def _chunk_starts(prev: str, prev_type: str, tag: str, kind: str) -> bool:
    """conlleval's startOfChunk: an I- after O, or after another type, starts a chunk (IOB1)."""
    if tag in ("B", "S"):
        return True
    if prev in ("E", "S", "O") and tag in ("E", "I"):
        return True
    return tag != "O" and prev_type != kind


def _chunks(tags: Sequence[str]) -> set[tuple[str, int, int]]:
    """The (type, first, last) chunks of one sentence, as conlleval reads them."""
    found = set()
    prev, prev_type, start = "O", "", 0
    for i, tag in enumerate([*tags, "O"]):  # the trailing O closes a chunk at the sentence's end
        cur, kind = _split_tag(tag)
        if prev != "O" and _chunk_ends(prev, prev_type, cur, kind):
            found.add((prev_type, start, i - 1))
        if cur != "O" and _chunk_starts(prev, prev_type, cur, kind):
            start = i
        prev, prev_type = cur, kind
    return found


def entity_scores(pred_tags: Sequence[Sequence[str]], gold_tags: Sequence[Sequence[str]]) -> dict[str, float]:
    """conlleval's entity-level scores over sentences of IOB1 or IOB2 (or IOBES) tags.

    A chunk counts as correct only when its type and both ends match. Each sentence starts and ends outside a
    chunk, as a blank line does in conlleval.

    Returns:
        {"entity_precision", "entity_recall", "entity_f1"} and "f1_<TYPE>" for each type in gold or
        predictions, all in 0..1 (0.0 where the denominator is 0).
    """
    if len(pred_tags) != len(gold_tags):
        raise ValueError(f"{len(pred_tags)} predicted sentences for {len(gold_tags)} gold ones")
    pred, gold = set(), set()
    for s, (p, g) in enumerate(zip(pred_tags, gold_tags)):
        if len(p) != len(g):
            raise ValueError(f"sentence {s}: {len(p)} predicted tags for {len(g)} gold ones")
        pred.update((s, *c) for c in _chunks(p))
        gold.update((s, *c) for c in _chunks(g))
    scores = dict(zip(("entity_precision", "entity_recall", "entity_f1"), _prf(pred, gold)))
    for kind in sorted({c[1] for c in pred | gold}):
        scores[f"f1_{kind}"] = _prf({c for c in pred if c[1] == kind}, {c for c in gold if c[1] == kind})[2]
    return scores


def _prf(pred: set, gold: set) -> tuple[float, float, float]:
    correct = len(pred & gold)
    precision = correct / len(pred) if pred else 0.0
    recall = correct / len(gold) if gold else 0.0
    f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
    return precision, recall, f1


def multilabel_scores(
    pred: Sequence[Sequence[int]], gold: Sequence[Sequence[int]], names: Sequence[str] | None = None
) -> dict[str, float]:
    """Multi-label scores of 0/1 indicator rows (examples x labels).

    Returns:
        {"micro_f1", "macro_f1", "subset_accuracy"} and "f1_<label>" for each column (`names`, else its index).
    """
    p, g = np.asarray(pred, dtype=bool), np.asarray(gold, dtype=bool)
    if p.shape != g.shape or p.ndim != 2 or p.shape[1] == 0:
        raise ValueError(f"pred and gold must be indicator matrices of one shape, not {p.shape} and {g.shape}")
    if p.shape[0] == 0:
        raise ValueError("no predictions to score")
    tp, fp, fn = (p & g).sum(0), (p & ~g).sum(0), (~p & g).sum(0)  # (L,) each
    per_label = np.where(2 * tp + fp + fn > 0, 2 * tp / np.maximum(2 * tp + fp + fn, 1), 0.0)
    micro = 2 * tp.sum() + fp.sum() + fn.sum()
    out = {
        "micro_f1": float(2 * tp.sum() / micro) if micro else 0.0,
        "macro_f1": float(per_label.mean()),
        "subset_accuracy": float((p == g).all(1).mean()),
    }
    labels = names if names is not None else [str(j) for j in range(p.shape[1])]
    out.update({f"f1_{label}": float(f) for label, f in zip(labels, per_label)})
    return out


def check_names(kind: str, names: Sequence[str], what: str) -> None:
    """Known metric names that score a task of `kind`, each once; ValueError naming the first that is not, as
    `what` (task.metrics in a config, the metrics a checkpoint stores)."""
    fits = BY_KIND[kind]
    for i, name in enumerate(names):
        if name not in METRICS:
            raise ValueError(f"{what}: unknown metric {name!r}; a {kind} task takes {', '.join(fits)}")
        if name not in fits:
            raise ValueError(f"{what}: {name} does not score a {kind} task; it takes {', '.join(fits)}")
        if name in names[:i]:
            raise ValueError(f"{what} names {name} twice; name each metric once")


def compute(
    metrics: Sequence[str], pred: Sequence, gold: Sequence, names: Sequence[str] | None = None
) -> dict[str, float]:
    """The named metrics of predictions against gold.

    Args:
        metrics: names from `METRICS`: accuracy, f1, mcc (label ids); pearson, spearman (floats);
            entity_f1, entity_precision, entity_recall (sentences of tags); macro_f1, micro_f1,
            subset_accuracy (indicator rows).
        pred: predictions, of the kind the metrics take.
        gold: gold labels, likewise.
        names: the label of each indicator column (multi-label), for the per-label keys.

    Returns:
        {name: value} for each name asked; when an entity metric is asked, also "f1_<TYPE>" for each type; when
        a multi-label one is, all three of them and "f1_<label>" for each label.
    """
    unknown = [m for m in metrics if m not in METRICS]
    if unknown:
        raise ValueError(f"unknown metric {unknown[0]!r}; known: {', '.join(METRICS)}")
    simple = {"accuracy": accuracy, "f1": f1_positive, "mcc": matthews, "pearson": pearson, "spearman": spearman}
    out = {m: simple[m](pred, gold) for m in metrics if m in simple}
    if any(m in _ENTITY for m in metrics):
        entity = entity_scores(pred, gold)
        out.update({m: entity[m] for m in metrics if m in _ENTITY})
        out.update({k: v for k, v in entity.items() if k.startswith("f1_")})
    if any(m in _MULTILABEL for m in metrics):
        out.update(multilabel_scores(pred, gold, names))
    return out


# Reported beside the F1 they make up, not counted in a task's score again (NER is judged by entity F1).
NOT_SCORED = ("entity_precision", "entity_recall")


def main_value(metrics_dict: dict[str, float], names: Sequence[str]) -> float:
    """A task's score: the mean of its metrics `names` (GLUE counts a two-metric task, like MRPC, as their mean),
    leaving out precision and recall where their F1 is among them."""
    if "entity_f1" in names:
        names = [n for n in names if n not in NOT_SCORED]
    missing = [n for n in names if n not in metrics_dict]
    if not names or missing:
        raise ValueError(f"no value for metric {missing[0] if missing else '(none named)'!r} in {sorted(metrics_dict)}")
    return float(np.mean([metrics_dict[n] for n in names]))
