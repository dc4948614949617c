"""Tests for scripts/make_bert_toy_data.py and the committed BERT corpus in data/bert_toy."""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "make_bert_toy_data.py"
DATA_DIR = REPO_ROOT / "data" / "bert_toy"
FILES = ("train.txt", "valid.txt")
SIZES = {"train.txt": 2000, "valid.txt": 200}


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_bert_toy_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def _documents(name: str) -> list[list[str]]:
    text = (DATA_DIR / name).read_text(encoding="utf-8")
    return [doc.split("\n") for doc in text.removesuffix("\n").split("\n\n")]


def _entities(sentence: str) -> set[str]:
    """Names and nouns (singular or plural) a sentence mentions; pronouns do not count."""
    words = {w.strip(".,").removesuffix("'s") for w in sentence.split()}
    nouns = set(gen.FEMALE_NAMES + gen.MALE_NAMES)
    for table in (gen.PERSON_NOUNS, gen.ANIMALS, gen.THINGS):
        for singular, (plural, *_rest) in table.items():
            nouns |= {singular, plural}
    return {w.lower() for w in words if w.lower() in nouns or w in nouns}


def test_generator_reproduces_committed_corpus(tmp_path):
    out = tmp_path / "bert_toy"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], check=True, capture_output=True)
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    for name in FILES:
        assert (out / name).read_bytes() == (DATA_DIR / name).read_bytes(), name


def test_small_run_is_deterministic_and_seed_dependent(tmp_path):
    def run(seed: int, out: Path) -> list[bytes]:
        gen.main(["--out", str(out), "--seed", str(seed), "--train-docs", "30", "--valid-docs", "5"])
        return [(out / name).read_bytes() for name in FILES]

    assert run(7, tmp_path / "a") == run(7, tmp_path / "b")
    assert run(7, tmp_path / "a") != run(8, tmp_path / "c")


@pytest.mark.parametrize("name", FILES)
def test_layout_single_blank_line_between_documents(name):
    text = (DATA_DIR / name).read_text(encoding="utf-8")
    assert text.endswith("\n") and not text.endswith("\n\n"), "no trailing blank line"
    assert not text.startswith("\n"), "no leading blank line"
    assert "\n\n\n" not in text, "documents are separated by exactly one blank line"
    assert "\r" not in text
    for doc in _documents(name):
        for line in doc:
            assert line and line == line.strip() and "  " not in line, repr(line)
            assert line[0].isupper() and line.endswith(".") and line.count(".") == 1, line


@pytest.mark.parametrize("name", FILES)
def test_document_counts_and_lengths(name):
    docs = _documents(name)
    assert len(docs) == SIZES[name]
    lengths = [len(doc) for doc in docs]
    assert max(lengths) <= 12
    assert sum(n >= 2 for n in lengths) >= 0.9 * len(docs), "most documents have a next sentence"
    assert sum(n >= 4 for n in lengths) >= 0.9 * len(docs)
    assert 1 in lengths, "a few one-sentence documents exercise the random-B-side-only path"


def test_tcli_reads_the_same_documents():
    from transformer_cli.data.bert import read_documents

    for name in FILES:
        assert read_documents(DATA_DIR / name, "text", False) == _documents(name)


def test_consecutive_sentences_share_entities_more_than_other_documents():
    docs = _documents("train.txt")
    within = [bool(_entities(a) & _entities(b)) for doc in docs for a, b in zip(doc, doc[1:])]
    # The last sentence of a story followed by the first of the next one, and sentence i of a story
    # against sentence i of the next one: what a NotNext pair looks like.
    across = [bool(_entities(d1[-1]) & _entities(d2[0])) for d1, d2 in zip(docs, docs[1:])]
    across += [bool(_entities(a) & _entities(b)) for d1, d2 in zip(docs, docs[1:]) for a, b in zip(d1, d2)]
    within_rate, across_rate = sum(within) / len(within), sum(across) / len(across)
    assert within_rate > 0.4, within_rate
    assert across_rate < 0.15, across_rate
    assert within_rate > 4 * across_rate


def test_one_tense_and_narrator_per_story():
    present = {"is", "are", "am", "has", "have", "goes", "go", "does"}
    past = {"was", "were", "had", "went", "did"}
    first_person = 0
    for doc in _documents("train.txt"):
        words = {w.strip(".,") for s in doc for w in s.split()}
        assert not (words & present and words & past), doc
        if len(doc) == 1:
            continue
        if "I" in words:
            first_person += 1
            assert "I" in doc[0].split(), doc  # the narrator introduces themself
        else:
            assert not words & {"me", "my", "My"}, doc
    assert 0.25 < first_person / len(_documents("train.txt")) < 0.55


def test_grammar_agreement_in_corpus():
    text = "\n".join((DATA_DIR / name).read_text(encoding="utf-8") for name in FILES)
    assert not re.search(r"\b[Aa] [aeiou]", text), "a before a vowel"
    assert not re.search(r"\b[Aa]n [^aeiou\s]", text), "an before a consonant"
    assert not re.search(r"(?<!and )\bI (is|are|has|goes|does|were)\b", text), "I am, I have, I go"
    assert not re.search(r"\b(he|she|it|He|She|It) (are|were|have|go|do) ", text), "3rd person singular"
    assert not re.search(r"\b(they|They) (is|was|has|goes|does) ", text), "3rd person plural"


def test_verb_forms():
    assert gen.verb_form("catch", "present", False) == "catches"
    assert gen.verb_form("carry", "present", False) == "carries"
    assert gen.verb_form("carry", "past", True) == "carried"
    assert gen.verb_form("chase", "past", False) == "chased"
    assert gen.verb_form("eat", "past", False) == "ate"
    assert gen.verb_form("bark", "present", True) == "bark"
    assert gen.verb_form("be", "present", False, first_person=True) == "am"
    assert gen.verb_form("have", "present", False, first_person=True) == "have"
    assert gen.verb_form("be", "past", True) == "were"
    assert gen.negated("like", "present", False) == ["does", "not", "like"]
