"""The evaluation both training and `tcli evaluate` run for translation: one set of functions, so the
numbers agree exactly: per-token NLL (and perplexity) over length-bucketed batches, and beam-search
output for sacreBLEU. These take a model, encoded data and plain settings; nothing here knows the trainer.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from transformer_cli.config import EvalConfig
from transformer_cli.data.translation import ParallelData, collate, token_batches
from transformer_cli.translation.decode import DecodeOptions, decode_corpus
from transformer_cli.vocab.spm import BOS_ID, EOS_ID, PAD_ID, Vocab

# ----------------------------------------------------------------------------- translation


@dataclass
class NllResult:
    nll: float  # summed over target tokens (EOS included)
    tokens: int

    @property
    def loss(self) -> float:
        return self.nll / self.tokens

    @property
    def ppl(self) -> float:
        return math.exp(min(self.loss, 50.0))


def translation_nll(
    model: nn.Module,
    data: ParallelData,
    max_tokens: int,
    device: torch.device,
    context: Callable,
    multiple: int = 1,
) -> NllResult:
    """Summed target NLL (no label smoothing) over batches of at most `max_tokens` padded tokens, in a
    fixed order (no shuffling), in the shapes training batches take (`train.pad_to_multiple`: `multiple`)."""
    nll, tokens = 0.0, 0
    lens = (np.array([len(s) for s in data.src]), np.array([len(t) for t in data.tgt]))
    for spec in token_batches(*lens, max_tokens, seed=0, epoch=0, shuffle=False, multiple=multiple):
        batch = collate(data, spec, PAD_ID, BOS_ID, EOS_ID, multiple, max_tokens).to(device)
        with context():
            out = model(batch.src, batch.tgt_in, labels=batch.labels)
        nll += float(out.nll)
        tokens += batch.tokens
    return NllResult(nll, tokens)


def translate_texts(
    model: nn.Module,
    sources: list[list[int]],
    opts: DecodeOptions,
    tgt_vocab: Vocab,
    device: torch.device,
    context: Callable,
    bucketed: bool = False,
) -> list[str]:
    """The best beam-search hypothesis of each source, detokenised (an empty string when none finished);
    `bucketed`: `decode_corpus`'s."""
    hyps = decode_corpus(model, sources, opts, BOS_ID, EOS_ID, device, context, bucketed)
    return tgt_vocab.decode([h[0].tokens if h else [] for h in hyps])


def eval_decode_options(e: EvalConfig) -> DecodeOptions:
    """The beam settings of a run's `eval:` section."""
    return DecodeOptions(e.beam, e.lenpen, e.max_len_a, e.max_len_b, e.max_tokens)


def translation_validation(
    model: nn.Module,
    data: ParallelData,
    tgt_vocab: Vocab,
    max_tokens: int,
    multiple: int,
    opts: DecodeOptions | None,
    bleu_tokenize: str,
    device: torch.device,
    context: Callable,
    bucketed: bool = False,
) -> dict[str, float]:
    """The eval event of a translation run: valid_loss (per-token NLL), valid_ppl and, when `opts` is
    given, sacreBLEU (cased, with the `bleu_tokenize` tokenizer) of beam-search output against the raw
    references (`bucketed`: `decode_corpus`'s)."""
    from transformer_cli.metrics.bleu import bleu

    result = translation_nll(model, data, max_tokens, device, context, multiple)
    metrics = {"valid_loss": result.loss, "valid_ppl": result.ppl}
    if opts is not None:
        hyps = translate_texts(model, data.src, opts, tgt_vocab, device, context, bucketed)
        metrics["bleu"] = bleu(hyps, data.references(), bleu_tokenize)[0]
    return metrics
