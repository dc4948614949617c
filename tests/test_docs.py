"""The README and shipped configs stay true: config reference in step, every config loads, modules import."""

from __future__ import annotations

import importlib
import pkgutil
import sys

import pytest

import transformer_cli
from transformer_cli.config import BertRunConfig, TranslationRunConfig, load_config

from .conftest import ROOT


def test_readme_config_reference_matches_code():
    sys.path.insert(0, str(ROOT / "scripts"))
    from update_readme_reference import updated

    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert updated(text) == text, "run: python scripts/update_readme_reference.py"


@pytest.mark.parametrize("path", sorted((ROOT / "configs").glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_config_loads(path):
    schema = BertRunConfig if path.name.startswith("bert") else TranslationRunConfig
    if path.name.startswith("finetune"):
        from transformer_cli.config import FinetuneRunConfig as schema
    load_config(schema, path)


def test_every_module_imports_with_base_dependencies():
    for module in pkgutil.walk_packages(transformer_cli.__path__, "transformer_cli."):
        importlib.import_module(module.name)


def test_readme_mentions_every_command():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    for command in (
        "tcli train",
        "tcli translate",
        "tcli pretrain-bert",
        "tcli export-hf",
        "tcli count-params",
        "tcli evaluate",
        "tcli fill-mask",
        "tcli plot",
        "tcli export-ct2",
        "tcli average",
        "tcli finetune",
        "tcli predict",
    ):
        assert command in text
