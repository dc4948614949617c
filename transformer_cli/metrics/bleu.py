"""Corpus scores of translations: BLEU and chrF through sacreBLEU (detokenised text, its own 13a tokenisation)."""

from __future__ import annotations

from dataclasses import dataclass


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


def bleu(hypotheses: list[str], references: list[str], lowercase: bool = False) -> tuple[float, str]:
    """Corpus BLEU and its sacreBLEU signature."""
    from sacrebleu.metrics import BLEU

    metric = BLEU(lowercase=lowercase)
    return metric.corpus_score(hypotheses, [references]).score, str(metric.get_signature())


def translation_scores(hypotheses: list[str], references: list[str]) -> TranslationScores:
    """Cased BLEU, lowercased BLEU and chrF of detokenised hypotheses against raw references."""
    from sacrebleu.metrics import CHRF

    cased, cased_sig = bleu(hypotheses, references)
    lower, lower_sig = bleu(hypotheses, references, lowercase=True)
    chrf = CHRF()
    chrf_score = chrf.corpus_score(hypotheses, [references]).score
    return TranslationScores(cased, lower, chrf_score, cased_sig, lower_sig, str(chrf.get_signature()))
