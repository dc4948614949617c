"""The README, the docs site and the shipped configs stay true: the generated reference pages are current,
every command and config key the pages name exists, every config loads, every module imports."""

from __future__ import annotations

import importlib
import pkgutil
import re
import sys

import pytest

import transformer_cli
from transformer_cli.config import BertRunConfig, TranslationRunConfig, load_config

from .conftest import ROOT


def _docs_reference():
    sys.path.insert(0, str(ROOT / "scripts"))
    import docs_reference

    return docs_reference


def test_generated_reference_pages_match_the_code():
    reference = _docs_reference()
    for name, make in reference.PAGES.items():
        page = ROOT / "docs" / "reference" / name
        assert page.read_text(encoding="utf-8") == make(), f"{page} is stale: run python scripts/docs_reference.py"


def _pages() -> list:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_every_command_the_pages_name_exists():
    import typer.main

    from transformer_cli.cli import app

    commands = set(typer.main.get_command(app).commands)
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        code = "\n".join(re.findall(r"```[a-z]*\n(.*?)```", text, re.S) + re.findall(r"`([^`\n]+)`", text))
        named = set(re.findall(r"(?:^|[\s|(])tcli ([a-z][a-z0-9-]+)", code, re.M))
        unknown = sorted(named - commands)
        assert not unknown, f"{page.relative_to(ROOT)} names commands tcli does not have: {unknown}"


def _keys() -> set[str]:
    from transformer_cli.config import SCHEMAS

    keys = set()
    for schema in SCHEMAS.values():
        for section, field in schema.model_fields.items():
            keys |= {f"{section}.{name}" for name in field.annotation.model_fields}
    return keys


# `train.en`, `valid.zh`, `test.tsv`: file names of a split, not keys
FILE_SUFFIXES = {
    "en",
    "de",
    "fr",
    "zh",
    "ja",
    "src",
    "tgt",
    "txt",
    "tsv",
    "csv",
    "json",
    "jsonl",
    "conll",
    "pt",
    "py",
    "bin",
    "safetensors",
}


def test_every_config_key_the_pages_name_exists():
    keys = _keys()
    sections = {k.split(".")[0] for k in keys}
    for page in _pages():
        text = page.read_text(encoding="utf-8")
        named = {m for m in re.findall(r"`([a-z_]+\.[a-z_]+)(?:[=:` ])", text) if m.split(".")[0] in sections}
        unknown = sorted(k for k in named - keys if k.split(".")[1] not in FILE_SUFFIXES)
        assert not unknown, f"{page.relative_to(ROOT)} names config keys that do not exist: {unknown}"


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
