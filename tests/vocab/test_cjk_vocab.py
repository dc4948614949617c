"""Vocabularies of Chinese text: every ideograph a token (vocab.split_cjk), character models (vocab.type: char),
and vocab.character_coverage: auto, resolved and recorded as a number."""

from __future__ import annotations

import random
import unicodedata
from pathlib import Path

import pytest

from transformer_cli.config import BertRunConfig, TranslationRunConfig, VocabConfig, build_config
from transformer_cli.core.cjk import IDEOGRAPH, cjk_share, has_cjk, is_ideograph
from transformer_cli.train.lifecycle import check_resume_config
from transformer_cli.train.task_setup import vocab_settings
from transformer_cli.vocab.spm import CJK_COVERAGE, resolve_coverage, train_vocab

SUBJECTS = ["我们", "他们", "老师", "学生", "公司", "政府", "记者", "经理", "医生", "朋友"]
VERBS = ["认为", "发现", "希望", "决定", "知道", "宣布", "表示", "看到"]
OBJECTS = ["经济发展很快", "价格上涨了", "天气很好", "服务不错", "房间很干净", "问题已经解决", "市场需要改革"]
STEPS = {"train": {"max_steps": 1}}
LATIN = ["iPhone", "Windows", "CEO", "GDP", "price", "internet", "online", "download", "computer"]


def chinese_lines(n: int, seed: int = 0) -> list[str]:
    """News-like Chinese with Latin words and numbers in it, written by the test."""
    rng = random.Random(seed)
    lines = []
    for _ in range(n):
        word, number = rng.choice(LATIN), rng.randint(1, 2025)
        lines.append(
            f"{rng.choice(SUBJECTS)}{rng.choice(VERBS)}{rng.choice(OBJECTS)}，{word}在{number}年"
            f"{rng.choice(OBJECTS)}。{rng.choice(SUBJECTS)}说{word} {rng.choice(LATIN)}很重要！"
        )
    return lines


def nfkc(text: str) -> str:
    return unicodedata.normalize("NFKC", text)


def ideograph_pieces(vocab) -> list[str]:
    pieces = [vocab.sp.id_to_piece(i) for i in range(len(vocab))]
    return [p for p in pieces if IDEOGRAPH.search(p)]


def test_bert_ranges():
    assert all(is_ideograph(c) for c in "中文漢字𠀀豈") and not any(is_ideograph(c) for c in "aあア한。！")
    assert has_cjk("ひらがな") and has_cjk("한국어") and has_cjk("！") and not has_cjk("Grüße, café")
    assert cjk_share("今天 ok") == pytest.approx(2 / 4) and cjk_share("  ") == 0.0


def test_split_cjk_makes_every_ideograph_a_token_and_decodes_without_spaces():
    lines = chinese_lines(400)
    vocab = train_vocab(lines, 600, split_cjk=True)
    pieces = ideograph_pieces(vocab)
    assert pieces and all(len(p.lstrip("▁")) == 1 for p in pieces)  # one ideograph, at most the word-start mark
    latin = [vocab.sp.id_to_piece(i) for i in range(len(vocab)) if vocab.sp.id_to_piece(i).strip("▁").isascii()]
    assert any(len(p.strip("▁")) > 2 for p in latin)  # other scripts are still subwords
    text = "经理认为价格上涨了，iPhone在2024年服务不错。"
    (ids,) = vocab.encode([text])
    tokens = [vocab.sp.id_to_piece(i) for i in ids]
    assert [t.lstrip("▁") for t in tokens if IDEOGRAPH.search(t)] == IDEOGRAPH.findall(text)
    # the text back as sentencepiece's NFKC normalisation gives it (，！ -> ,!): no spaces added
    assert vocab.decode(vocab.encode(lines[:50])) == [nfkc(line) for line in lines[:50]]
    assert vocab.decode([ids]) == [nfkc(text)]


def test_without_split_cjk_pieces_join_ideographs():
    vocab = train_vocab(chinese_lines(400), 600)
    assert any(len(IDEOGRAPH.findall(p)) > 1 for p in ideograph_pieces(vocab))


@pytest.mark.parametrize("model_type", ["unigram", "bpe"])
def test_split_cjk_with_both_model_types(model_type):
    vocab = train_vocab(chinese_lines(300, seed=1), 500, model_type, split_cjk=True)
    assert all(len(IDEOGRAPH.findall(p)) == 1 for p in ideograph_pieces(vocab))


def test_char_model_has_one_character_per_piece():
    vocab = train_vocab(chinese_lines(300) + ["The quick brown fox."], 400, "char")
    normal = [vocab.sp.id_to_piece(i) for i in range(4, len(vocab))]
    assert normal and all(len(p) == 1 for p in normal)
    assert vocab.decode(vocab.encode(["老师说iPhone很重要！"])) == [nfkc("老师说iPhone很重要！")]


@pytest.mark.parametrize(
    "value, langs, text, expected",
    [
        ("auto", ["en", "de"], ["The cat sat on the mat."], 1.0),
        ("auto", ["src", "tgt"], chinese_lines(5), CJK_COVERAGE),  # mostly Chinese text
        ("auto", ["en", "zh"], ["The cat."], CJK_COVERAGE),  # a Chinese side
        ("auto", ["ja_JP"], [], CJK_COVERAGE),
        ("auto", ["zh-TW"], [], CJK_COVERAGE),
        ("auto", ["ko"], [], CJK_COVERAGE),
        ("auto", [], ["The iPhone 是 a phone."], 1.0),  # a few CJK characters in English text
        ("auto", [], [], 1.0),
        (0.999, ["zh"], chinese_lines(5), 0.999),  # a number is kept
    ],
)
def test_resolve_coverage(value, langs, text, expected):
    assert resolve_coverage(value, langs, text) == expected


def test_auto_is_recorded_as_a_number_and_old_settings_stay_the_same():
    settings = vocab_settings("bert", VocabConfig(), 1, "abc", 1.0)
    # what vocab.json and manifests recorded before auto and split_cjk existed: the same dict, so runs and
    # preprocessed folders made then are still up to date
    old = {"size": 8000, "type": "unigram", "joint": True, "character_coverage": 1.0, "max_sentences": 1_000_000}
    assert settings["vocab"] == {**old, "model": None}
    cjk = vocab_settings("bert", VocabConfig(split_cjk=True), 1, "abc", CJK_COVERAGE)["vocab"]
    assert cjk["character_coverage"] == CJK_COVERAGE and cjk["split_cjk"] is True


def test_config_keys():
    cfg = build_config(BertRunConfig, {"vocab": {"type": "char", "split_cjk": True}, **STEPS}, "t")
    assert cfg.vocab.type == "char" and cfg.vocab.split_cjk and cfg.vocab.character_coverage == "auto"
    assert (
        build_config(BertRunConfig, {"vocab": {"character_coverage": 0.9995}, **STEPS}, "t").vocab.character_coverage
        == 0.9995
    )
    for bad in ({"character_coverage": 0.5}, {"character_coverage": "most"}, {"split_cjk": "yes"}):
        with pytest.raises(Exception, match="vocab"):
            build_config(BertRunConfig, {"vocab": bad, **STEPS}, "t")


def test_resume_of_a_run_from_before_auto():
    """A checkpoint's config from before `auto` holds character_coverage 1.0 (the old default): resuming it with a
    config that leaves the key out (auto) is no change; another number is."""
    old = build_config(TranslationRunConfig, STEPS, "t").model_dump(mode="json")
    old["vocab"]["character_coverage"] = 1.0
    del old["vocab"]["split_cjk"]
    new = build_config(TranslationRunConfig, STEPS, "t").model_dump(mode="json")
    check_resume_config(old, new, Path("run"))
    changed = build_config(TranslationRunConfig, {"vocab": {"character_coverage": 0.99}, **STEPS}, "t").model_dump(
        mode="json"
    )
    with pytest.raises(Exception, match="vocab.character_coverage"):
        check_resume_config(old, changed, Path("run"))
