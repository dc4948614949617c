"""One home per kind: every module of transformer_cli/kinds/ beside the shared ones is one registered kind, and
the low table config.py validates with (core/kinds.TASK_KINDS) names the same kinds with the same metrics."""

from __future__ import annotations

import importlib
import typing
from pathlib import Path

import pytest

from transformer_cli.config import FinetuneRunConfig, FinetuneTaskConfig, load_config
from transformer_cli.core.kinds import TASK_KINDS
from transformer_cli.data.labeled import LABEL_FORMS
from transformer_cli.kinds.base import Kind
from transformer_cli.kinds.registry import KINDS, kind_of
from transformer_cli.metrics.task_metrics import BY_KIND, METRICS
from transformer_cli.models.heads import LOSSES

SHARED = {"__init__", "base", "features", "finetuned", "registry"}  # the modules that are no kind
KINDS_DIR = Path(__file__).resolve().parents[2] / "transformer_cli" / "kinds"


def test_the_registry_and_the_low_table_name_the_same_kinds():
    assert list(KINDS) == list(TASK_KINDS)
    assert typing.get_args(FinetuneTaskConfig.model_fields["kind"].annotation) == tuple(KINDS)
    assert BY_KIND == {name: kind.metrics for name, kind in KINDS.items()}


@pytest.mark.parametrize("module", sorted(p.stem for p in KINDS_DIR.glob("*.py") if p.stem not in SHARED))
def test_each_kind_module_holds_one_registered_kind_of_its_name(module):
    found = [
        v
        for v in vars(importlib.import_module(f"transformer_cli.kinds.{module}")).values()
        if isinstance(v, type) and issubclass(v, Kind) and v is not Kind and v.__module__.endswith(f".{module}")
    ]
    assert len(found) == 1, found
    assert found[0].name == module and type(KINDS[module]) is found[0]


@pytest.mark.parametrize("name", list(KINDS))
def test_a_kind_names_what_the_rest_of_the_package_knows(name):
    kind = KINDS[name]
    assert kind.metrics and set(kind.default_metrics) <= set(kind.metrics) <= set(METRICS)
    assert kind.reads in ("table", "conll", "squad") and kind.label_form in LABEL_FORMS and kind.loss in LOSSES
    hf_classes = ("BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering")
    assert kind.hf_class in hf_classes
    assert 0 <= kind.fewest_labels <= kind.most_labels
    assert load_config(FinetuneRunConfig, None, [f"task.kind={name}"]).task.kind == name
    transformers = pytest.importorskip("transformers")
    assert hasattr(transformers, kind.hf_class)


def test_an_unknown_kind_is_one_line_naming_the_kinds():
    from transformer_cli.core.errors import UserError

    with pytest.raises(UserError, match=r"unknown task kind 'ranking'; the kinds are classification, regression"):
        kind_of("ranking")
    with pytest.raises(Exception, match="classification"):
        load_config(FinetuneRunConfig, None, ["task.kind=ranking"])
