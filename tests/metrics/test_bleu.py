"""BLEU by language: sacreBLEU's tokenizer chosen from the target language, Chinese scored on characters, and a
tokenizer that cannot run refused in one line."""

from __future__ import annotations

import sys

import pytest

from transformer_cli.config import TranslationRunConfig, load_config
from transformer_cli.core.errors import UserError
from transformer_cli.metrics.bleu import (
    bleu,
    require_tokenizer,
    resolve_tokenizer,
    tokenizer_names,
    translation_scores,
    usable_tokenizer,
)

from ..conftest import one_line_error

# Chinese as written: no spaces, full-width punctuation.
ZH_REFS = ["我们为什么要工作？", "今天的天气非常好。", "他每天早上七点起床。", "这本书是我朋友写的。"]
ZH_CLOSE = ["我们为什么要上班？", "今天的天气很好。", "他每天早上八点起床。", "这本书是我朋友写的。"]


@pytest.mark.parametrize(
    ("tgt_lang", "expected"),
    [
        ("zh", "zh"),
        ("zh-TW", "zh"),
        ("zh-cn", "zh"),
        ("zh_Hans", "zh"),
        ("ZH", "zh"),
        ("cmn", "zh"),
        ("yue", "zh"),
        ("ja", "ja-mecab"),
        ("ko", "ko-mecab"),
        ("de", "13a"),
        ("en", "13a"),
        ("tgt", "13a"),
        ("zhx", "13a"),  # a code that only starts like zh is another language
    ],
)
def test_auto_picks_the_tokenizer_by_target_language(tgt_lang, expected):
    assert resolve_tokenizer("auto", tgt_lang) == expected
    assert resolve_tokenizer("char", tgt_lang) == "char"  # a named tokenizer is never replaced


def test_a_chinese_translation_is_scored_on_characters_not_as_one_word():
    tokenize = resolve_tokenizer("auto", "zh")
    perfect, signature = bleu(ZH_REFS, ZH_REFS, tokenize)
    assert perfect == pytest.approx(100.0) and "tok:zh" in signature
    close = bleu(ZH_CLOSE, ZH_REFS, tokenize)[0]
    assert 50.0 < close < 100.0
    # 13a leaves each sentence one or two "words": not even a perfect translation has a 4-gram to match
    assert bleu(ZH_REFS, ZH_REFS, "13a")[0] == 0.0 and bleu(ZH_CLOSE, ZH_REFS, "13a")[0] == 0.0


def test_translation_scores_use_the_tokenizer_for_both_bleus_and_leave_chrf_alone():
    zh, old = translation_scores(ZH_CLOSE, ZH_REFS, "zh"), translation_scores(ZH_CLOSE, ZH_REFS, "13a")
    assert "tok:zh" in zh.bleu_signature and "tok:zh" in zh.bleu_lc_signature and "case:lc" in zh.bleu_lc_signature
    assert "tok:zh" in zh.lines()[0] and "tok:13a" in old.lines()[0]
    assert zh.bleu > old.bleu and zh.chrf == old.chrf and zh.chrf_signature == old.chrf_signature


def test_the_config_key_takes_auto_and_sacrebleus_own_list(tmp_path):
    names = tokenizer_names()
    assert {"13a", "intl", "zh", "char", "ja-mecab", "ko-mecab", "none", "flores101", "flores200"} <= set(names)
    assert load_config(TranslationRunConfig, None, ["train.max_steps=1"]).eval.bleu_tokenize == "auto"
    for name in ("auto", "zh", "char", "intl", "none"):
        cfg = load_config(TranslationRunConfig, None, ["train.max_steps=1", f"eval.bleu_tokenize={name}"])
        assert cfg.eval.bleu_tokenize == name
    with pytest.raises(UserError) as info:
        load_config(TranslationRunConfig, None, ["train.max_steps=1", "eval.bleu_tokenize=jieba"])
    one_line_error(info, "eval.bleu_tokenize", "'jieba'", "13a", "flores200")


@pytest.mark.parametrize(
    ("tokenize", "tgt_lang", "module", "extra"),
    [("ja-mecab", "de", "MeCab", "[ja]"), ("auto", "ja", "ipadic", "[ja]"), ("auto", "ko", "mecab_ko", "[ko]")],
)
def test_a_missing_mecab_is_one_line_naming_the_extra(monkeypatch, tokenize, tgt_lang, module, extra):
    monkeypatch.setitem(sys.modules, module, None)  # `import MeCab` then raises ImportError, installed or not
    with pytest.raises(UserError) as info:
        usable_tokenizer(tokenize, tgt_lang, "eval.bleu_tokenize")
    line = one_line_error(info, "eval.bleu_tokenize", "MeCab", f"pip install 'transformer-cli{extra}'")
    if tokenize == "auto":
        assert f"target language {tgt_lang}" in line


def test_the_tokenizers_without_extra_packages_are_usable():
    for name in ("13a", "intl", "zh", "char", "none"):
        require_tokenizer(name, "eval.bleu_tokenize")  # no error
    assert usable_tokenizer("auto", "zh-TW", "--bleu-tokenize") == "zh"
