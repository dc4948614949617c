"""Splitting paragraphs into sentences (for BERT's next-sentence pairs), in Latin scripts and in Chinese and Japanese,
and WikiText's headings."""

from __future__ import annotations

import re

from transformer_cli.core.cjk import WIDE

_WIDE = WIDE.pattern[1:-1]  # the CJK characters, for character classes below

# Latin: . ! ? then spaces, before a capital or a digit (or a CJK character, in mixed text).
_LATIN_END = re.compile(rf"(?<=[.!?])[\"')\]]?\s+(?=[\"'(\[]?[A-Z0-9]|[{_WIDE}])")

_CLOSERS = "」』”’）】》〉〕］｝〗〙\"')"  # closing quotes and brackets stay with the sentence they end
# Chinese and Japanese: 。！？ (and a run of them: ！？ ？！), an ellipsis ……, ! ? or six dots right after a CJK
# character (in Latin text they keep the Latin rule), then the closing quotes and brackets; no space needs to follow.
_CJK_END = re.compile(rf"(?:[。！？｡]|(?<=[{_WIDE}])(?:[!?]|\.{{6,}})|…{{2,}})[。！？｡!?…]*[{re.escape(_CLOSERS)}]*\s*")
# After the end of a sentence in a quote: a comma or colon continues it (“好！”，他说), so does Japanese 「…。」と.
_CONTINUES = "，、,：:；;"
_QUOTATIVE = re.compile("[」』]と")

_ABBREVIATIONS = {
    "mr.",
    "mrs.",
    "ms.",
    "dr.",
    "prof.",
    "st.",
    "vs.",
    "etc.",
    "e.g.",
    "i.e.",
    "jr.",
    "sr.",
    "no.",
    "fig.",
    "inc.",
    "ltd.",
    "co.",
    "u.s.",
    "a.m.",
    "p.m.",
}
_BEFORE_LATIN = re.compile(rf"^.*[{_WIDE}]")  # what precedes a Latin word that follows CJK text without a space


def split_sentences(paragraph: str) -> list[str]:
    """Rule-based splitter. Latin scripts: break after . ! ? before a capital or digit, except after common
    abbreviations and single-letter initials. Chinese and Japanese: break after 。！？ (or a run of them), an
    ellipsis ……, or ! ? after a CJK character, keeping the closing quotes and brackets that follow, unless a comma
    or Japanese quotative と continues the sentence."""
    ends = [m.end() for m in _LATIN_END.finditer(paragraph) if not _abbreviation(paragraph, m.start())]
    ends += [m.end() for m in _CJK_END.finditer(paragraph) if not _continues(paragraph, m.end())]
    pieces, start = [], 0
    for end in sorted(set(ends)):
        if end > start:
            pieces.append(paragraph[start:end].strip())
            start = end
    pieces.append(paragraph[start:].strip())
    return [p for p in pieces if p]


def _abbreviation(paragraph: str, at: int) -> bool:
    """The word that ends at `at` (a Latin sentence end's candidate) is an abbreviation or an initial."""
    words = paragraph[:at].split()
    last_word = _BEFORE_LATIN.sub("", words[-1]).lower() if words else ""
    return last_word in _ABBREVIATIONS or re.fullmatch(r"[a-z]\.", last_word) is not None


def _continues(paragraph: str, end: int) -> bool:
    """The sentence goes on after a CJK end that finishes at `end`."""
    if end >= len(paragraph):
        return False
    return paragraph[end] in _CONTINUES or _QUOTATIVE.match(paragraph, end - 1) is not None


def heading_level(text: str) -> int:
    """WikiText headings: `= Title =` is level 1, `= = Section = =` level 2, ...; other lines 0."""
    words = text.split()
    if len(words) < 3 or words[0] != "=" or words[-1] != "=":
        return 0
    level = 0
    while level < len(words) and words[level] == "=":
        level += 1
    return level if level < len(words) else 0
