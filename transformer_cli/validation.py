"""The evaluation both training and `tcli evaluate` run: one set of functions, so the numbers agree exactly.

Translation: per-token NLL (and perplexity) over length-bucketed batches, and beam-search output for
sacreBLEU. BERT: MLM loss/accuracy and NSP accuracy over held-out NSP instances drawn once from
rng seed `train.seed + 7919`, batched and masked from fixed seeds. These take a model, encoded data and
plain settings; nothing here knows the trainer (inference never imports the training loop).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from transformer_cli.config import EvalConfig
from transformer_cli.datasets.bert import (
    BertBatch,
    Instance,
    SpecialIds,
    batch_seed,
    length_batches,
    make_batch,
    make_instances,
)
from transformer_cli.datasets.translation import ParallelData, collate, token_batches
from transformer_cli.decode import DecodeOptions, decode_corpus
from transformer_cli.vocab import BOS_ID, EOS_ID, PAD_ID, Vocab

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
    device: torch.device,
    context: Callable,
    bucketed: bool = False,
) -> dict[str, float]:
    """The eval event of a translation run: valid_loss (per-token NLL), valid_ppl and, when `opts` is
    given, sacreBLEU (cased) of beam-search output against the raw references (`bucketed`: `decode_corpus`'s)."""
    from transformer_cli.scores import bleu

    result = translation_nll(model, data, max_tokens, device, context, multiple)
    metrics = {"valid_loss": result.loss, "valid_ppl": result.ppl}
    if opts is not None:
        hyps = translate_texts(model, data.src, opts, tgt_vocab, device, context, bucketed)
        metrics["bleu"] = bleu(hyps, data.references())[0]
    return metrics


# ----------------------------------------------------------------------------- BERT

HELD_OUT_SEED_OFFSET = 7919  # held-out NSP pairs: random.Random(train.seed + 7919)
BATCH_ORDER_SEED_OFFSET = 104729  # held-out batches: random.Random(train.seed + 104729)


def bert_special_ids(vocab_size: int) -> SpecialIds:
    """[PAD] [UNK] [CLS] [SEP] [MASK] at ids 0-4 (checked when a BERT checkpoint is read)."""
    return SpecialIds(pad=0, cls=2, sep=3, mask=4, first_normal=5, vocab_size=vocab_size)


def held_out_instances(
    docs: list[list[list[int]]], seed: int, max_seq_len: int, short_seq_prob: float
) -> list[Instance]:
    """The held-out NSP pairs, drawn once so that every evaluation scores the same thing."""
    return make_instances(docs, max_seq_len, short_seq_prob, random.Random(seed + HELD_OUT_SEED_OFFSET))


def held_out_batches(
    instances: list[Instance], ids: SpecialIds, seed: int, batch_size: int, mask_prob: float, max_predictions: int
) -> Iterator[BertBatch]:
    """The held-out batches every evaluation scores, on the CPU: the same order and masks each time."""
    rng = random.Random(seed + BATCH_ORDER_SEED_OFFSET)
    for number, indices in enumerate(length_batches([len(x) for x in instances], batch_size, rng)):
        generator = torch.Generator().manual_seed(batch_seed(seed, 3, number))
        yield make_batch([instances[i] for i in indices], ids, mask_prob, max_predictions, generator)


def bert_validation(
    model: nn.Module,
    instances: list[Instance],
    ids: SpecialIds,
    seed: int,
    batch_size: int,
    mask_prob: float,
    max_predictions: int,
    device: torch.device,
    context: Callable,
) -> dict[str, float]:
    """MLM loss and accuracy at the masked positions, NSP accuracy, perplexity = exp(MLM loss)."""
    sums = {"mlm_loss": 0.0, "mlm_correct": 0, "mlm": 0, "nsp_correct": 0, "nsp": 0}
    for batch in held_out_batches(instances, ids, seed, batch_size, mask_prob, max_predictions):
        batch = batch.to(device)
        with context():
            out = model(batch.input_ids, batch.segment_ids, batch.mlm_labels, batch.nsp_labels)
        sums["mlm_loss"] += float(out.mlm_loss)
        sums["mlm_correct"] += int(out.mlm_correct)
        sums["nsp_correct"] += int(out.nsp_correct)
        sums["mlm"] += int(out.mlm_count)
        sums["nsp"] += out.nsp_count
    mlm_loss = sums["mlm_loss"] / max(sums["mlm"], 1)
    return {
        "mlm_loss": mlm_loss,
        "mlm_acc": sums["mlm_correct"] / max(sums["mlm"], 1),
        "nsp_acc": sums["nsp_correct"] / max(sums["nsp"], 1),
        "ppl": math.exp(min(mlm_loss, 50.0)),
    }
