"""Tests for scripts/make_toy_data.py and the committed corpus in data/toy."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
SCRIPT = REPO_ROOT / "scripts" / "make_toy_data.py"
DATA_DIR = REPO_ROOT / "data" / "toy"
SPLITS = ("train", "val", "test")
FILES = [f"{split}.{side}" for split in SPLITS for side in ("src", "tgt")]


def _load_generator():
    spec = importlib.util.spec_from_file_location("make_toy_data", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look the module up by name
    spec.loader.exec_module(module)
    return module


gen = _load_generator()


def _lines(name: str) -> list[str]:
    return (DATA_DIR / name).read_text(encoding="utf-8").split("\n")[:-1]


def test_generator_reproduces_committed_corpus(tmp_path):
    out = tmp_path / "toy"
    subprocess.run([sys.executable, str(SCRIPT), "--out", str(out)], check=True, capture_output=True)
    produced = sorted(p.name for p in out.iterdir())
    assert produced == sorted(FILES)
    for name in FILES:
        assert (out / name).read_bytes() == (DATA_DIR / name).read_bytes(), name


def test_small_run_is_deterministic_and_seed_dependent(tmp_path):
    def run(seed: int, out: Path) -> list[bytes]:
        args = ["--out", str(out), "--seed", str(seed), "--train", "50", "--val", "5", "--test", "5"]
        gen.main(args)
        return [(out / name).read_bytes() for name in FILES]

    assert run(7, tmp_path / "a") == run(7, tmp_path / "b")
    assert run(7, tmp_path / "a") != run(8, tmp_path / "c")


@pytest.mark.parametrize("split", SPLITS)
def test_src_tgt_line_counts_match(split):
    src = (DATA_DIR / f"{split}.src").read_bytes()
    tgt = (DATA_DIR / f"{split}.tgt").read_bytes()
    assert src.endswith(b"\n") and tgt.endswith(b"\n")
    assert src.count(b"\n") == tgt.count(b"\n") > 0


def test_default_sizes():
    assert [len(_lines(f"{split}.src")) for split in SPLITS] == [12000, 500, 500]


@pytest.mark.parametrize("name", FILES)
def test_no_empty_lines_and_sentence_shape(name):
    for line in _lines(name):
        assert line.strip() == line and line, f"empty or padded line in {name}: {line!r}"
        assert line[0].isupper() and line.endswith("."), line
        assert "  " not in line
    if name.endswith(".src"):
        lengths = [len(line.split()) for line in _lines(name)]
        assert gen.MIN_WORDS <= min(lengths) and max(lengths) <= gen.MAX_WORDS


def test_no_source_sentence_repeated_across_or_within_splits():
    seen: set[str] = set()
    for split in SPLITS:
        lines = _lines(f"{split}.src")
        assert len(set(lines)) == len(lines), split
        assert not seen & set(lines), split
        seen.update(lines)


def test_reordering_and_agreement_rules():
    # Numbers and adjectives follow the noun (adjectives in mirror order),
    # PP becomes a postpositional phrase after the subject, object + "ka"
    # precedes the verb, negation "ne" precedes the verb, plural past "-in".
    s = gen.Sentence(
        subj=gen.NP("dog", det="two", plural=True, adjs=("big", "black")),
        vp=gen.VP("see", tense="past", negated=True, obj=gen.NP("cat", det="a", adjs=("red",))),
        pp=("in", gen.NP("garden", det="the")),
    )
    assert gen.render_source(s) == "Two big black dogs did not see a red cat in the garden."
    assert gen.render_target(s) == "Hundoj nigroj grandoj du la garda en una kata ruba ka ne vidin."


def test_gender_article_and_relative_clause_agreement():
    # Feminine plural subject: article "laj", adjective "-aj"; the relative
    # clause verb agrees with its (plural) head noun, the main verb with the
    # singular name; "an" before a vowel in English only.
    s = gen.Sentence(
        subj=gen.NP("Anna", det="name"),
        vp=gen.VP(
            "follow",
            obj=gen.NP(
                "cow",
                det="the",
                plural=True,
                adjs=("old",),
                rel=gen.VP("eat", tense="present", obj=gen.NP("apple", det="a")),
            ),
        ),
    )
    assert gen.render_source(s) == "Anna follows the old cows that eat an apple."
    assert gen.render_target(s) == "Anna laj vakaj antikaj ki un pomo ka mangan ka sekvas."

    # Same words, singular masculine subject, intransitive, present negated.
    s = gen.Sentence(
        subj=gen.NP("elephant", det="a", adjs=("old",)),
        vp=gen.VP("sleep", negated=True),
    )
    assert gen.render_source(s) == "An old elephant does not sleep."
    assert gen.render_target(s) == "Un elefanto antiko ne dormas."


def test_target_is_a_function_of_source():
    # Within the committed corpus the same source never maps to two targets,
    # and distinct sources map to distinct targets (no information is lost).
    mapping: dict[str, str] = {}
    for split in SPLITS:
        for src, tgt in zip(_lines(f"{split}.src"), _lines(f"{split}.tgt"), strict=True):
            assert mapping.setdefault(src, tgt) == tgt
    assert len(set(mapping.values())) == len(mapping)
