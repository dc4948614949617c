"""Every kind of fine-tuning task by name: a new kind is a module beside this one, listed here and in
core/kinds.TASK_KINDS (its name and metrics, for config.py)."""

from __future__ import annotations

from transformer_cli.core.errors import UserError
from transformer_cli.kinds.base import Kind
from transformer_cli.kinds.classification import Classification
from transformer_cli.kinds.multilabel import Multilabel
from transformer_cli.kinds.regression import Regression
from transformer_cli.kinds.span import SpanExtraction
from transformer_cli.kinds.tagging import Tagging

KINDS: dict[str, Kind] = {
    kind.name: kind for kind in (Classification(), Regression(), Tagging(), Multilabel(), SpanExtraction())
}


def kind_of(name: str, source: str = "task.kind") -> Kind:
    """The kind named `name`; an unknown name is a one-line error naming `source`."""
    if name not in KINDS:
        raise UserError(f"{source}: unknown task kind {name!r}; the kinds are {', '.join(KINDS)}")
    return KINDS[name]
