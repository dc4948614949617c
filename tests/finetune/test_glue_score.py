"""The GLUE score: the benchmark's rows, its mean of task means, and what it refuses."""

from __future__ import annotations

import math

import pytest

from transformer_cli.finetune import glue


def test_glue_row_names():
    assert glue.glue_row("sst2", "dev") == "sst2"
    assert glue.glue_row("mnli", "dev_matched") == "mnli-m"
    assert glue.glue_row("mnli", "dev_mismatched") == "mnli-mm"


def test_glue_score_worked_example():
    per_task = {
        "cola": {"mcc": 0.50, "loss": 3.0},  # keys that are not the task's metrics are ignored
        "mrpc": {"f1": 0.90, "accuracy": 0.80},  # two metrics: the task counts 0.85
        "stsb": {"pearson": 0.88, "spearman": 0.86},  # 0.87
        "mnli-m": {"accuracy": 0.84},
        "mnli-mm": {"accuracy": 0.82},  # MNLI is one task: 0.83
        "wnli": {"accuracy": 0.56},
    }
    want = (0.50 + 0.85 + 0.87 + 0.83 + 0.56) / 5
    assert glue.glue_score(per_task) == pytest.approx(want)
    table = glue.glue_table(per_task)
    lines = table.strip().split("\n")
    assert lines[0] == "| task | metrics | score |"
    assert [line.split("|")[1].strip() for line in lines[2:-1]] == ["cola", "mrpc", "stsb", "mnli", "wnli"]
    assert "| mrpc | f1 90.0 / accuracy 80.0 | 85.0 |" in lines
    assert "| mnli | accuracy (m) 84.0 / accuracy (mm) 82.0 | 83.0 |" in lines
    assert lines[-1] == f"| **GLUE score** (5 of 9 tasks) | | **{100 * want:.1f}** |"


def test_glue_score_rejects_unknown_rows_and_missing_metrics():
    with pytest.raises(ValueError, match="unknown GLUE row"):
        glue.glue_score({"squad": {"accuracy": 1.0}})
    with pytest.raises(ValueError, match="unknown GLUE row"):
        glue.glue_score({"sst2-x": {"accuracy": 1.0}})
    with pytest.raises(ValueError, match="accuracy"):
        glue.glue_score({"mrpc": {"f1": 1.0}})
    with pytest.raises(ValueError):
        glue.glue_score({})
    assert not math.isnan(glue.glue_score({"rte": {"accuracy": 0.6}}))
