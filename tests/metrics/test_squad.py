"""SQuAD scores: hand-worked cases, and random cases scored by the official scripts' logic written out below."""

from __future__ import annotations

import collections
import random
import re
import string

import pytest

from transformer_cli.core.errors import UserError
from transformer_cli.metrics.squad import best_threshold, exact_match, normalize_answer, squad_v1, squad_v2, token_f1

# ----------------------------------------------------------------------------- the official scripts' logic
# evaluate-v1.1.py and evaluate-v2.0.py as published with SQuAD (their functions, on the same nested dataset).


def official_normalize(s):
    def remove_articles(text):
        return re.sub(r"\b(a|an|the)\b", " ", text)

    def white_space_fix(text):
        return " ".join(text.split())

    def remove_punc(text):
        exclude = set(string.punctuation)
        return "".join(ch for ch in text if ch not in exclude)

    return white_space_fix(remove_articles(remove_punc(s.lower())))


def official_v1(dataset, predictions):
    def f1_score(prediction, ground_truth):
        prediction_tokens = official_normalize(prediction).split()
        ground_truth_tokens = official_normalize(ground_truth).split()
        common = collections.Counter(prediction_tokens) & collections.Counter(ground_truth_tokens)
        num_same = sum(common.values())
        if num_same == 0:
            return 0
        precision = 1.0 * num_same / len(prediction_tokens)
        recall = 1.0 * num_same / len(ground_truth_tokens)
        return (2 * precision * recall) / (precision + recall)

    def exact_match_score(prediction, ground_truth):
        return official_normalize(prediction) == official_normalize(ground_truth)

    f1 = em = total = 0
    for article in dataset:
        for paragraph in article["paragraphs"]:
            for qa in paragraph["qas"]:
                total += 1
                if qa["id"] not in predictions:
                    continue
                ground_truths = [x["text"] for x in qa["answers"]]
                prediction = predictions[qa["id"]]
                em += max(exact_match_score(prediction, gt) for gt in ground_truths)
                f1 += max(f1_score(prediction, gt) for gt in ground_truths)
    return {"exact_match": 100.0 * em / total, "f1": 100.0 * f1 / total}


def official_v2(dataset, preds, na_probs=None, na_prob_thresh=1.0):
    def get_tokens(s):
        return official_normalize(s).split() if s else []

    def compute_exact(a_gold, a_pred):
        return int(official_normalize(a_gold) == official_normalize(a_pred))

    def compute_f1(a_gold, a_pred):
        gold_toks, pred_toks = get_tokens(a_gold), get_tokens(a_pred)
        common = collections.Counter(gold_toks) & collections.Counter(pred_toks)
        num_same = sum(common.values())
        if len(gold_toks) == 0 or len(pred_toks) == 0:
            return int(gold_toks == pred_toks)
        if num_same == 0:
            return 0
        precision = 1.0 * num_same / len(pred_toks)
        recall = 1.0 * num_same / len(gold_toks)
        return (2 * precision * recall) / (precision + recall)

    qid_to_has_ans = {qa["id"]: bool(qa["answers"]) for a in dataset for p in a["paragraphs"] for qa in p["qas"]}
    exact_raw, f1_raw = {}, {}
    for article in dataset:
        for p in article["paragraphs"]:
            for qa in p["qas"]:
                qid = qa["id"]
                gold_answers = [a["text"] for a in qa["answers"] if official_normalize(a["text"])] or [""]
                a_pred = preds[qid]
                exact_raw[qid] = max(compute_exact(a, a_pred) for a in gold_answers)
                f1_raw[qid] = max(compute_f1(a, a_pred) for a in gold_answers)

    def apply(scores, probs):
        return {q: float(not qid_to_has_ans[q]) if probs[q] > na_prob_thresh else s for q, s in scores.items()}

    def make_eval_dict(exact_scores, f1_scores, qid_list=None):
        if not qid_list:
            total = len(exact_scores)
            return {
                "exact": 100.0 * sum(exact_scores.values()) / total,
                "f1": 100.0 * sum(f1_scores.values()) / total,
                "total": total,
            }
        total = len(qid_list)
        return {
            "exact": 100.0 * sum(exact_scores[k] for k in qid_list) / total,
            "f1": 100.0 * sum(f1_scores[k] for k in qid_list) / total,
            "total": total,
        }

    def find_best_thresh(scores, probs):
        num_no_ans = sum(1 for k in qid_to_has_ans if not qid_to_has_ans[k])
        cur_score = best_score = num_no_ans
        best_thresh = 0.0
        for qid in sorted(probs, key=lambda k: probs[k]):
            if qid not in scores:
                continue
            if qid_to_has_ans[qid]:
                diff = scores[qid]
            else:
                diff = -1 if preds[qid] else 0
            cur_score += diff
            if cur_score > best_score:
                best_score = cur_score
                best_thresh = probs[qid]
        return 100.0 * best_score / len(scores), best_thresh

    probs = na_probs if na_probs is not None else {k: 0.0 for k in preds}
    exact_thresh, f1_thresh = apply(exact_raw, probs), apply(f1_raw, probs)
    out = make_eval_dict(exact_thresh, f1_thresh)
    has = [k for k, v in qid_to_has_ans.items() if v]
    no = [k for k, v in qid_to_has_ans.items() if not v]
    if has:
        out.update({f"HasAns_{k}": v for k, v in make_eval_dict(exact_thresh, f1_thresh, has).items()})
    if no:
        out.update({f"NoAns_{k}": v for k, v in make_eval_dict(exact_thresh, f1_thresh, no).items()})
    if na_probs is not None:
        out["best_exact"], out["best_exact_thresh"] = find_best_thresh(exact_raw, probs)
        out["best_f1"], out["best_f1_thresh"] = find_best_thresh(f1_raw, probs)
    return out


# ----------------------------------------------------------------------------- hand-worked cases


def test_normalisation_lowercases_and_drops_punctuation_articles_and_spaces():
    assert normalize_answer("The  Denver Broncos!") == "denver broncos"
    assert normalize_answer("An apple, a pear") == "apple pear"
    assert normalize_answer("theory") == "theory"  # only whole words are articles
    assert normalize_answer("1,000") == "1000"
    assert normalize_answer("U.S.") == "us"
    assert normalize_answer("the-end") == "theend"  # punctuation goes first: the hyphen joins the words
    assert normalize_answer("Café  Ä") == "café ä"  # accents stay
    assert normalize_answer("北京，中国") == "北京，中国"  # full-width punctuation is not string.punctuation


def test_token_f1_by_hand():
    # pred "denver broncos win", gold "broncos": 1 common word, precision 1/3, recall 1 -> F1 0.5
    assert token_f1("Denver Broncos win", "the Broncos") == pytest.approx(0.5)
    # a repeated word counts as often as both sides have it: "x x y" and "x y y" share one x and one y
    assert token_f1("x x y", "x y y") == pytest.approx(2 / 3)
    assert token_f1("", "") == 0.0  # v1.1: nothing in common
    assert token_f1("", "", version_2=True) == 1.0  # v2.0: both say "no answer"
    assert token_f1("the", "", version_2=True) == 1.0  # "the" normalises to nothing
    assert token_f1("Denver", "", version_2=True) == 0.0
    assert exact_match("The Broncos.", "broncos") == 1.0
    assert exact_match("Broncos win", "broncos") == 0.0


def test_v1_takes_the_best_gold_answer_and_counts_missing_predictions_as_zero():
    golds = {"q1": ["Denver Broncos", "the Broncos"], "q2": ["1,000 people"], "q3": ["Paris"]}
    preds = {"q1": "Broncos", "q2": "1000 people"}  # q3 has no prediction
    out = squad_v1(golds, preds)
    # q1: "the Broncos" normalises to "broncos" (EM 1, F1 1); q2: "1,000" is "1000" (EM 1, F1 1); q3: 0
    assert out["exact_match"] == pytest.approx(200 / 3)
    assert out["f1"] == pytest.approx(200 / 3)


def test_v2_no_answer_questions_and_the_best_threshold_by_hand():
    golds = {"a": ["Paris"], "b": [], "c": ["42"], "d": []}
    preds = {"a": "Paris", "b": "", "c": "41", "d": "London"}
    out = squad_v2(golds, preds)
    assert (out["exact"], out["total"]) == (50.0, 4)  # a and b right
    assert (out["HasAns_exact"], out["HasAns_total"]) == (50.0, 2)
    assert (out["NoAns_exact"], out["NoAns_total"]) == (50.0, 2)
    assert "best_exact" not in out
    # with probabilities: in rising order a (.1, +1), c (.2, +0), d (.3, -1), b (.9, 0): running totals from 2
    # (all "no answer": b, d right) are 3, 3, 2, 2 -> best 3 of 4 at threshold .1
    probs = {"a": 0.1, "b": 0.9, "c": 0.2, "d": 0.3}
    out = squad_v2(golds, preds, probs, no_answer_threshold=0.25)
    assert out["best_exact"] == 75.0 and out["best_exact_thresh"] == 0.1
    # threshold .25: d (.3) and b (.9) count as "no answer" (both right), a and c keep their scores
    assert out["exact"] == 75.0 and out["NoAns_exact"] == 100.0


def test_v2_needs_a_prediction_for_every_question():
    with pytest.raises(UserError, match="no prediction for question 'b'"):
        squad_v2({"a": ["x"], "b": []}, {"a": "x"})
    with pytest.raises(UserError, match="no questions"):
        squad_v1({}, {})


# ----------------------------------------------------------------------------- against the official logic

WORDS = ["the", "a", "an", "Denver", "broncos", "Broncos", "1,000", "U.S.", "café", "theory", "-", ",", "x", "北京"]


def random_text(rng: random.Random, most: int = 4) -> str:
    return rng.choice(["", " ", "  "]).join(rng.choice(WORDS) for _ in range(rng.randint(0, most)))


def random_case(rng: random.Random, unanswerable: float):
    dataset, preds, probs = [{"paragraphs": []}], {}, {}
    for i in range(rng.randint(1, 30)):
        qid = f"q{i}"
        answers = [] if rng.random() < unanswerable else [{"text": random_text(rng)} for _ in range(rng.randint(1, 3))]
        dataset[0]["paragraphs"].append({"qas": [{"id": qid, "answers": answers}]})
        preds[qid] = random_text(rng) if rng.random() < 0.8 else ""
        probs[qid] = rng.choice([0.0, 0.25, 0.5, 0.75, 1.0]) if rng.random() < 0.5 else rng.random()  # ties too
    golds = {qa["id"]: [a["text"] for a in qa["answers"]] for p in dataset[0]["paragraphs"] for qa in p["qas"]}
    return dataset, golds, preds, probs


def test_v1_matches_the_official_script_on_random_cases():
    rng = random.Random(0)
    for _ in range(300):
        dataset, golds, preds, _ = random_case(rng, unanswerable=0.0)
        if rng.random() < 0.3:
            preds.pop(rng.choice(list(preds)))
        want = official_v1(dataset, preds)
        got = squad_v1(golds, preds)
        assert got == pytest.approx(want)


def test_v2_matches_the_official_script_on_random_cases():
    rng = random.Random(1)
    for _ in range(300):
        dataset, golds, preds, probs = random_case(rng, unanswerable=0.4)
        threshold = rng.choice([1.0, 0.5, 0.3])
        assert squad_v2(golds, preds, no_answer_threshold=threshold) == pytest.approx(
            official_v2(dataset, preds, na_prob_thresh=threshold)
        )
        got = squad_v2(golds, preds, probs, threshold)
        want = official_v2(dataset, preds, probs, threshold)
        assert got.keys() == want.keys()
        assert got == pytest.approx(want)


def test_best_threshold_keeps_the_first_of_equal_totals():
    # answerable a (+1) then unanswerable b with a prediction (-1) then answerable c (+1): totals 1, 2, 1, 2
    has = {"a": True, "b": False, "c": True}
    preds = {"a": "x", "b": "y", "c": "z"}
    score, threshold = best_threshold(preds, {"a": 1.0, "b": 0.0, "c": 1.0}, {"a": 0.1, "b": 0.2, "c": 0.3}, has)
    assert (score, threshold) == (pytest.approx(200 / 3), 0.1)
