"""The evaluation both training and `tcli evaluate` run for BERT: MLM loss/accuracy and NSP accuracy over
held-out NSP instances drawn once from rng seed `train.seed + 7919`, batched and masked from fixed seeds.
These take a model, encoded data and plain settings; nothing here knows the trainer.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator

import torch
from torch import nn

from transformer_cli.data.bert import (
    BertBatch,
    Instance,
    SpecialIds,
    batch_seed,
    length_batches,
    make_batch,
    make_instances,
)

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
