"""SQuAD scores as the official scripts compute them: evaluate-v1.1.py (exact match and token F1, the best over a
question's gold answers) and evaluate-v2.0.py (unanswerable questions, HasAns_/NoAns_ splits, a no-answer
threshold, and the search for the best threshold over no-answer probabilities).

Gold answers are given per question id as a list of texts; an empty list is an unanswerable question (SQuAD v2's
`answers: []`). Scores are percentages, as the scripts print them. Pure Python: no torch.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Mapping, Sequence

from transformer_cli.core.errors import UserError, quote

_PUNCTUATION = frozenset(string.punctuation)  # ASCII only, as the scripts: "，" or "«" stay in the text
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(text: str) -> str:
    """Lower case, punctuation removed, the articles a/an/the removed, whitespace collapsed (the scripts' order:
    punctuation goes before articles, so "the-end" keeps no article but "the end" loses one)."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, gold: str) -> float:
    """1.0 when the normalised texts are equal, else 0.0."""
    return float(normalize_answer(prediction) == normalize_answer(gold))


def token_f1(prediction: str, gold: str, version_2: bool = False) -> float:
    """F1 of the normalised texts' word multisets. With `version_2` (evaluate-v2.0.py) an empty side scores 1.0
    only against another empty one; evaluate-v1.1.py scores any empty side 0.0."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(gold).split()
    if version_2 and (not pred or not ref):
        return float(pred == ref)
    same = sum((Counter(pred) & Counter(ref)).values())
    if same == 0:
        return 0.0
    precision, recall = same / len(pred), same / len(ref)
    return 2 * precision * recall / (precision + recall)


def squad_v1(golds: Mapping[str, Sequence[str]], predictions: Mapping[str, str]) -> dict[str, float]:
    """evaluate-v1.1.py: {"exact_match", "f1"} in percent over every question of `golds`; a question without a
    prediction scores 0 (the script warns and counts it)."""
    if not golds:
        raise UserError("no questions to score")
    em = f1 = 0.0
    for qid, answers in golds.items():
        if qid not in predictions:
            continue
        pred = predictions[qid]
        # the v1.1 script takes max() over the gold texts: a question with none would crash it; it scores 0 here
        em += max((exact_match(pred, g) for g in answers), default=0.0)
        f1 += max((token_f1(pred, g) for g in answers), default=0.0)
    return {"exact_match": 100.0 * em / len(golds), "f1": 100.0 * f1 / len(golds)}


def squad_v2(
    golds: Mapping[str, Sequence[str]],
    predictions: Mapping[str, str],
    no_answer_probs: Mapping[str, float] | None = None,
    no_answer_threshold: float = 1.0,
) -> dict[str, float]:
    """evaluate-v2.0.py: "exact", "f1", "total", then "HasAns_*" and "NoAns_*" (exact, f1, total) where there are
    such questions; with `no_answer_probs` (question id -> probability, or any score where higher means "no
    answer") a question whose probability exceeds `no_answer_threshold` counts as answered "no answer", and
    "best_exact", "best_exact_thresh", "best_f1", "best_f1_thresh" give the best scores over all thresholds.

    Every question needs a prediction ("" = no answer): the script fails on a missing one.
    """
    if not golds:
        raise UserError("no questions to score")
    missing = [qid for qid in golds if qid not in predictions]
    if missing:
        raise UserError(
            f"no prediction for question {quote(missing[0])} ({len(missing)} missing); SQuAD v2 scores every question"
        )
    if no_answer_probs is None:
        probs = {qid: 0.0 for qid in predictions}
    else:
        lacking = [qid for qid in golds if qid not in no_answer_probs]
        if lacking:
            raise UserError(f"no no-answer probability for question {quote(lacking[0])} ({len(lacking)} missing)")
        probs = dict(no_answer_probs)
    has_answer = {qid: bool(answers) for qid, answers in golds.items()}
    exact_raw, f1_raw = {}, {}
    for qid, answers in golds.items():
        # a gold text that normalises to nothing (" ", "the") is dropped; none left: the one right answer is ""
        texts = [a for a in answers if normalize_answer(a)] or [""]
        pred = predictions[qid]
        exact_raw[qid] = max(exact_match(pred, a) for a in texts)
        f1_raw[qid] = max(token_f1(pred, a, version_2=True) for a in texts)
    exact = _with_threshold(exact_raw, probs, has_answer, no_answer_threshold)
    f1 = _with_threshold(f1_raw, probs, has_answer, no_answer_threshold)
    out = _summary(exact, f1, list(golds))
    for prefix, wanted in (("HasAns", True), ("NoAns", False)):
        ids = [qid for qid, has in has_answer.items() if has == wanted]
        if ids:
            out.update({f"{prefix}_{k}": v for k, v in _summary(exact, f1, ids).items()})
    if no_answer_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = best_threshold(predictions, exact_raw, probs, has_answer)
        out["best_f1"], out["best_f1_thresh"] = best_threshold(predictions, f1_raw, probs, has_answer)
    return out


def _with_threshold(
    scores: dict[str, float], probs: Mapping[str, float], has_answer: Mapping[str, bool], threshold: float
) -> dict[str, float]:
    """A question predicted unanswerable (probability above the threshold) scores 1 exactly when it is."""
    return {qid: float(not has_answer[qid]) if probs[qid] > threshold else s for qid, s in scores.items()}


def _summary(exact: Mapping[str, float], f1: Mapping[str, float], ids: list[str]) -> dict[str, float]:
    return {
        "exact": 100.0 * sum(exact[q] for q in ids) / len(ids),
        "f1": 100.0 * sum(f1[q] for q in ids) / len(ids),
        "total": len(ids),
    }


def best_threshold(
    predictions: Mapping[str, str],
    scores: Mapping[str, float],
    probs: Mapping[str, float],
    has_answer: Mapping[str, bool],
) -> tuple[float, float]:
    """evaluate-v2.0.py's find_best_thresh: (best score in percent, its threshold). Start from answering "no
    answer" everywhere (every unanswerable question right), then let the questions through in order of rising
    probability, each adding its own score (answerable) or losing its point unless its prediction was "" too
    (unanswerable); the best running total wins, the first one on a tie. Equal probabilities keep the order of
    `probs`, as the script's stable sort does."""
    current = best = sum(1 for has in has_answer.values() if not has)
    threshold = 0.0
    for qid in sorted(probs, key=lambda k: probs[k]):
        if qid not in scores:
            continue
        if has_answer[qid]:
            current += scores[qid]
        elif predictions[qid]:
            current -= 1
        if current > best:
            best, threshold = current, probs[qid]
    return 100.0 * best / len(scores), threshold
