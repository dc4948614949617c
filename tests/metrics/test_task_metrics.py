"""task_metrics against independent computations (sklearn, scipy, seqeval) and hand-worked cases."""

from __future__ import annotations

import numpy as np
import pytest

from transformer_cli.metrics import task_metrics as tm

SEEDS = range(40)


def _labels(rng: np.random.Generator, k: int) -> tuple[list[int], list[int]]:
    n = int(rng.integers(1, 60))
    gold = rng.integers(0, k, n)
    # Predictions agree with gold more often than chance, so that scores span their range.
    pred = np.where(rng.random(n) < rng.random(), gold, rng.integers(0, k, n))
    return pred.tolist(), gold.tolist()


@pytest.mark.filterwarnings("ignore:A single label was found")
def test_classification_metrics_match_sklearn():
    skm = pytest.importorskip("sklearn.metrics")
    for seed in range(12):  # sklearn's input validation is slow: fewer seeds, three class counts each
        rng = np.random.default_rng(seed)
        for k in (2, 3, 5):
            pred, gold = _labels(rng, k)
            assert tm.accuracy(pred, gold) == pytest.approx(skm.accuracy_score(gold, pred))
            assert tm.matthews(pred, gold) == pytest.approx(skm.matthews_corrcoef(gold, pred), abs=1e-12)
            if k == 2:
                want = skm.f1_score(gold, pred, pos_label=1, zero_division=0.0)
                assert tm.f1_positive(pred, gold) == pytest.approx(want)
                want0 = skm.f1_score(gold, pred, pos_label=0, zero_division=0.0)
                assert tm.f1_positive(pred, gold, positive=0) == pytest.approx(want0)


def test_classification_edge_cases():
    assert tm.f1_positive([0, 0, 0], [1, 1, 0]) == 0.0  # no true positive
    assert tm.f1_positive([0, 0], [0, 0]) == 0.0
    assert tm.matthews([1, 1, 1], [0, 1, 0]) == 0.0  # constant predictions: undefined, 0.0 like sklearn
    assert tm.matthews([0, 1, 2], [0, 1, 2]) == pytest.approx(1.0)
    assert tm.matthews([1, 0], [0, 1]) == pytest.approx(-1.0)
    # Hand-worked: tp=2 fp=1 fn=1 tn=1 -> (2*1 - 1*1) / sqrt(3*3*2*2) = 1/6.
    assert tm.matthews([1, 1, 1, 0, 0], [1, 1, 0, 1, 0]) == pytest.approx(1 / 6)
    assert tm.accuracy([1, 2, 3], [1, 2, 0]) == pytest.approx(2 / 3)
    with pytest.raises(ValueError):
        tm.accuracy([1, 2], [1])
    with pytest.raises(ValueError):
        tm.accuracy([], [])


def test_matthews_large_counts_do_not_overflow():
    gold = np.tile([0, 1], 200_000)
    pred = gold.copy()
    pred[:1000] = 1 - pred[:1000]
    skm = pytest.importorskip("sklearn.metrics")
    assert tm.matthews(pred, gold) == pytest.approx(skm.matthews_corrcoef(gold, pred))


def test_correlations_match_scipy_with_ties():
    stats = pytest.importorskip("scipy.stats")
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        n = int(rng.integers(3, 80))
        # Rounded to a few values: many ties, as STS-B's 0..5 gold scores in steps of 0.2 have.
        gold = np.round(rng.uniform(0, 5, n) * 5) / 5
        pred = np.round(gold + rng.normal(0, rng.uniform(0.1, 3), n), int(rng.integers(0, 3)))
        if np.ptp(gold) == 0 or np.ptp(pred) == 0:
            continue
        assert tm.pearson(pred, gold) == pytest.approx(stats.pearsonr(pred, gold)[0], abs=1e-10)
        assert tm.spearman(pred, gold) == pytest.approx(stats.spearmanr(pred, gold)[0], abs=1e-10)


def test_ranks_average_ties():
    assert tm._ranks(np.array([10.0, 20.0, 10.0, 30.0, 20.0])).tolist() == [1.5, 3.5, 1.5, 5.0, 3.5]


def test_correlation_of_a_constant_side_is_zero_not_nan():
    assert tm.pearson([1.0, 1.0, 1.0], [0.0, 1.0, 2.0]) == 0.0
    assert tm.spearman([0.0, 1.0, 2.0], [3.0, 3.0, 3.0]) == 0.0
    assert tm.pearson([1.0, 2.0, 3.0], [2.0, 4.0, 6.0]) == pytest.approx(1.0)
    assert tm.spearman([1.0, 2.0, 3.0], [30.0, 20.0, 10.0]) == pytest.approx(-1.0)


# --- entities -------------------------------------------------------------------------------------------------

TYPES = ("PER", "LOC", "ORG")


def _iob2(rng: np.random.Generator, n: int) -> list[str]:
    tags, inside = [], None
    for _ in range(n):
        r = rng.random()
        if r < 0.4:
            tags.append("O")
            inside = None
        elif r < 0.7 and inside:
            tags.append(f"I-{inside}")
        else:
            inside = str(rng.choice(TYPES))
            tags.append(f"B-{inside}")
    return tags


def _iob1(tags: list[str]) -> list[str]:
    """IOB2 -> IOB1: B- only where a chunk follows one of the same type."""
    out = []
    for i, tag in enumerate(tags):
        if tag.startswith("B-") and not (i and tags[i - 1] != "O" and tags[i - 1][2:] == tag[2:]):
            tag = "I-" + tag[2:]
        out.append(tag)
    return out


def _noisy(rng: np.random.Generator, tags: list[str], noise: float) -> list[str]:
    choices = ["O"] + [f"{p}-{t}" for p in "BI" for t in TYPES]
    return [str(rng.choice(choices)) if rng.random() < noise else t for t in tags]


def _seqeval_scores(pred: list[list[str]], gold: list[list[str]]) -> dict[str, float]:
    seqeval = pytest.importorskip("seqeval.metrics")
    want = {
        "entity_precision": seqeval.precision_score(gold, pred),
        "entity_recall": seqeval.recall_score(gold, pred),
        "entity_f1": seqeval.f1_score(gold, pred),
    }
    report = seqeval.classification_report(gold, pred, output_dict=True, zero_division=0)
    want.update({f"f1_{k}": v["f1-score"] for k, v in report.items() if k in TYPES})
    return want


@pytest.mark.parametrize("scheme", ["iob2", "iob1", "mixed"])
def test_entity_scores_match_seqeval(scheme):
    pytest.importorskip("seqeval.metrics")
    for seed in SEEDS:
        rng = np.random.default_rng(seed)
        gold = [_iob2(rng, int(rng.integers(1, 15))) for _ in range(int(rng.integers(1, 8)))]
        if scheme != "iob2":
            gold = [_iob1(s) for s in gold]
        noise = rng.uniform(0, 0.5)
        # "mixed": random tags, so I- after O and type changes inside a chunk occur on both sides.
        pred = [_noisy(rng, s, noise if scheme != "mixed" else 0.6) for s in gold]
        got = tm.entity_scores(pred, gold)
        want = _seqeval_scores(pred, gold)
        for key, value in want.items():
            assert got[key] == pytest.approx(value), (seed, key, pred, gold)
        assert {k for k in got if k.startswith("f1_")} >= {k for k in want if k.startswith("f1_")}


def test_entity_chunks_hand_worked():
    # B-PER I-PER is one entity; an I-LOC after O starts one (IOB1); a type change inside splits it.
    assert tm._chunks(["B-PER", "I-PER", "O", "I-LOC", "I-LOC"]) == {("PER", 0, 1), ("LOC", 3, 4)}
    assert tm._chunks(["B-PER", "I-ORG", "I-ORG"]) == {("PER", 0, 0), ("ORG", 1, 2)}
    assert tm._chunks(["I-PER", "B-PER", "I-PER"]) == {("PER", 0, 0), ("PER", 1, 2)}
    assert tm._chunks(["B-LOC", "B-LOC"]) == {("LOC", 0, 0), ("LOC", 1, 1)}
    assert tm._chunks(["O", "O"]) == set()
    # A chunk at a sentence's end is closed there, not joined with the next sentence's first word.
    scores = tm.entity_scores([["B-PER"], ["I-PER"]], [["B-PER"], ["B-PER"]])
    assert scores["entity_precision"] == scores["entity_recall"] == scores["entity_f1"] == 1.0


def test_entity_scores_worked_example():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "I-ORG"]]
    # Correct: PER(0-1) only. Predicted 3, gold 3 -> p = r = f1 = 1/3.
    s = tm.entity_scores(pred, gold)
    assert s["entity_precision"] == pytest.approx(1 / 3)
    assert s["entity_recall"] == pytest.approx(1 / 3)
    assert s["entity_f1"] == pytest.approx(1 / 3)
    assert s["f1_PER"] == 1.0 and s["f1_LOC"] == 0.0 and s["f1_ORG"] == 0.0
    assert tm.entity_scores([["O"]], [["O"]])["entity_f1"] == 0.0
    with pytest.raises(ValueError):
        tm.entity_scores([["O"]], [["O", "O"]])


# --- compute, main_value, GLUE --------------------------------------------------------------------------------


def test_compute_by_name():
    got = tm.compute(["f1", "accuracy"], [1, 0, 1, 1], [1, 0, 0, 1])
    assert got == {"f1": pytest.approx(0.8), "accuracy": pytest.approx(0.75)}
    assert tm.main_value(got, ["f1", "accuracy"]) == pytest.approx(0.775)
    reg = tm.compute(["pearson", "spearman"], [0.1, 0.5, 0.4], [1.0, 2.0, 3.0])  # ranks 1 3 2 vs 1 2 3
    assert set(reg) == {"pearson", "spearman"} and reg["spearman"] == pytest.approx(0.5)
    ent = tm.compute(["entity_f1"], [["B-PER", "O"]], [["B-PER", "B-LOC"]])
    assert ent == {"entity_f1": pytest.approx(2 / 3), "f1_PER": 1.0, "f1_LOC": 0.0}
    assert tm.compute(["mcc"], [0, 1], [0, 1]) == {"mcc": pytest.approx(1.0)}
    with pytest.raises(ValueError, match="unknown metric"):
        tm.compute(["bleu"], [0], [0])
    with pytest.raises(ValueError):
        tm.main_value({"f1": 0.5}, ["f1", "accuracy"])


def test_a_tagging_score_is_the_entity_f1_and_a_two_metric_task_the_mean():
    tagged = {"entity_f1": 0.5, "entity_precision": 0.25, "entity_recall": 1.0}
    assert tm.main_value(tagged, ["entity_f1", "entity_precision", "entity_recall"]) == 0.5
    assert tm.main_value({"f1": 0.8, "accuracy": 0.6}, ["f1", "accuracy"]) == pytest.approx(0.7)


def test_multilabel_metrics_match_sklearn_on_indicator_matrices():
    skm = pytest.importorskip("sklearn.metrics")
    for seed in range(12):
        rng = np.random.default_rng(seed)
        n, k = int(rng.integers(1, 40)), int(rng.integers(2, 6))  # (one column: sklearn reads binary)
        gold = (rng.random((n, k)) < rng.random()).astype(int)
        pred = np.where(rng.random((n, k)) < 0.7, gold, 1 - gold)
        got = tm.compute(["macro_f1", "micro_f1", "subset_accuracy"], pred.tolist(), gold.tolist(), "abcdef"[:k])
        assert got["micro_f1"] == pytest.approx(skm.f1_score(gold, pred, average="micro", zero_division=0))
        assert got["macro_f1"] == pytest.approx(skm.f1_score(gold, pred, average="macro", zero_division=0))
        assert got["subset_accuracy"] == pytest.approx(skm.accuracy_score(gold, pred))
        per_label = skm.f1_score(gold, pred, average=None, zero_division=0)
        assert [got[f"f1_{c}"] for c in "abcdef"[:k]] == pytest.approx(per_label.tolist())


def test_multilabel_hand_worked_case():
    # label 0: tp 1 fp 1 (F1 2/3); label 1: fn 1 (F1 0); label 2: never gold nor predicted (F1 0, counted)
    got = tm.multilabel_scores([[1, 0, 0], [1, 0, 0]], [[1, 1, 0], [0, 0, 0]])
    assert got["micro_f1"] == pytest.approx(2 / (2 + 1 + 1)) and got["macro_f1"] == pytest.approx((2 / 3) / 3)
    assert got["subset_accuracy"] == 0.0 and got["f1_2"] == 0.0
