"""Which characters are Chinese, Japanese or Korean: the ideographs that Chinese BERTs make tokens of their own, and
the wider set of characters a font must have to draw CJK text."""

from __future__ import annotations

import re

# The CJK Unified Ideographs blocks as BERT's BasicTokenizer._is_chinese_char defines them (transformers'
# tokenization_bert): the ideographs, their extensions A to E and the compatibility ideographs. Hiragana, katakana
# and hangul are not in it: they write space-separated words and are tokenised like other scripts.
IDEOGRAPH_RANGES = (
    (0x4E00, 0x9FFF),
    (0x3400, 0x4DBF),
    (0x20000, 0x2A6DF),
    (0x2A700, 0x2B73F),
    (0x2B740, 0x2B81F),
    (0x2B820, 0x2CEAF),
    (0xF900, 0xFAFF),
    (0x2F800, 0x2FA1F),
)

# What a font needs beyond the ideographs to draw CJK text: CJK punctuation, kana, hangul, full-width forms.
_WIDE_RANGES = IDEOGRAPH_RANGES + (
    (0x3000, 0x303F),  # CJK symbols and punctuation: 。「」
    (0x3040, 0x30FF),  # hiragana, katakana
    (0x3100, 0x31FF),  # bopomofo, hangul compatibility jamo, katakana extensions
    (0x1100, 0x11FF),  # hangul jamo
    (0xAC00, 0xD7AF),  # hangul syllables
    (0xFF00, 0xFFEF),  # full-width and half-width forms: ！？（）
)


def _class(ranges: tuple[tuple[int, int], ...]) -> str:
    return "".join(f"{chr(lo)}-{chr(hi)}" for lo, hi in ranges)


IDEOGRAPH_CLASS = _class(IDEOGRAPH_RANGES)  # for a regex character class: f"[{IDEOGRAPH_CLASS}]"
IDEOGRAPH = re.compile(f"[{IDEOGRAPH_CLASS}]")
WIDE = re.compile(f"[{_class(_WIDE_RANGES)}]")


def is_ideograph(char: str) -> bool:
    """BERT's _is_chinese_char: `char` is a CJK ideograph."""
    cp = ord(char)
    return any(lo <= cp <= hi for lo, hi in IDEOGRAPH_RANGES)


def has_cjk(text: str) -> bool:
    """`text` holds a character a font without CJK glyphs cannot draw (ideographs, kana, hangul, CJK punctuation)."""
    return WIDE.search(text) is not None


def cjk_share(text: str) -> float:
    """The share of CJK characters among the characters of `text` that are not spaces (0 for none)."""
    chars = len(text) - sum(map(str.isspace, text))
    return len(WIDE.findall(text)) / chars if chars else 0.0
