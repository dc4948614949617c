"""Fine-tuning heads on a pretrained BERT encoder (Devlin et al., 2019, section 4).

Sequence classification and regression read the pooled `[CLS]` vector: tanh(W h_[CLS] + b) (the pooler NSP
trained), then dropout and one linear layer to the labels (or to one output for regression); as nothing else is
read, the encoder's last block computes the [CLS] position alone (`Bert.encode(first_only=True)`, the same
values). Tagging reads every position's hidden state through dropout and a linear layer; only each word's first
piece carries a label (the others are IGNORE). Multi-label classification reads [CLS] too, one sigmoid per label.
Extractive QA reads every position, a start and an end logit each (`BertQuestionAnswering`, HF's `qa_outputs`). The
task's kind (transformer_cli/kinds/) chooses which head and which loss; this module knows nothing of kinds or
configs. Parameter names follow HF's BertForSequenceClassification and BertForTokenClassification: `bert.*` for
the encoder, `classifier.*` for the head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor, nn

from transformer_cli.models.bert import Bert
from transformer_cli.models.losses import IGNORE

# Softmax cross-entropy over the classes (or tags), the squared error of one output, or binary cross-entropy of
# one sigmoid per label (multi-label; HF's BCEWithLogitsLoss, its mean over labels).
LOSSES = ("cross_entropy", "mse", "bce")


@dataclass
class HeadLoss:
    """A sum over the labelled items of a batch (sequences, or first pieces for tagging); the trainer
    normalises by their count over the global batch."""

    loss: Tensor
    logits: Tensor  # (B, C), (B, 1) or (B, T, C)


class BertClassifier(nn.Module):
    """A BERT encoder (no pretraining heads) with a head on the pooled [CLS] vector, or on every position
    (`per_token`), trained with `loss`."""

    def __init__(
        self, encoder: Bert, outputs: int, dropout: float = 0.1, per_token: bool = False, loss: str = "cross_entropy"
    ):
        super().__init__()
        if loss not in LOSSES:
            raise ValueError(f"unknown loss {loss!r}; expected one of {', '.join(LOSSES)}")
        self.per_token, self.loss = per_token, loss
        self.bert = encoder
        d_model = encoder.pooler.in_features
        self.dropout = nn.Dropout(dropout)
        self.classifier = nn.Linear(d_model, outputs)
        nn.init.normal_(self.classifier.weight, std=0.02)  # BERT's initialisation, as for every new matrix
        nn.init.zeros_(self.classifier.bias)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, labels: Tensor | None = None) -> Tensor | HeadLoss:
        """(B, T) ids and segments -> logits; with labels, the summed loss as well.

        labels: (B,) class ids, (B,) float targets for the squared error, (B, C) 0/1 targets for "bce", or,
        `per_token`, (B, T) tags with IGNORE at the positions that carry none (special tokens, padding, a word's
        later pieces).
        """
        if self.per_token:
            hidden = self.bert.encode(input_ids, segment_ids)  # (B, T, d)
            logits = self.classifier(self.dropout(hidden))  # (B, T, C)
        else:
            hidden = self.bert.encode(input_ids, segment_ids, first_only=True)  # (B, 1, d): [CLS] is all it reads
            logits = self.classifier(self.dropout(self.bert.pooled(hidden)))  # (B, C)
        if labels is None:
            return logits
        if self.loss == "mse":
            loss = F.mse_loss(logits.float().squeeze(-1), labels.float(), reduction="sum")
        elif self.loss == "bce":  # per example the mean over its labels, as HF's mean over (B, C) once divided by B
            per_label = F.binary_cross_entropy_with_logits(logits.float(), labels.float(), reduction="none")
            loss = per_label.mean(-1).sum()
        elif self.per_token:
            flat = logits.float().reshape(-1, logits.size(-1))  # (B*T, C)
            loss = F.cross_entropy(flat, labels.reshape(-1), ignore_index=IGNORE, reduction="sum")
        else:
            loss = F.cross_entropy(logits.float(), labels, reduction="sum")
        return HeadLoss(loss, logits)


class BertQuestionAnswering(nn.Module):
    """A BERT encoder with extractive QA's head (Devlin et al., 2019, section 4.2): one linear layer from every
    position's hidden state to a start and an end logit, no dropout before it (HF's BertForQuestionAnswering,
    whose state-dict name `qa_outputs` it keeps). The loss is the mean of the start and the end cross-entropy
    over the positions, as BERT's run_squad.py and HF compute it."""

    def __init__(self, encoder: Bert):
        super().__init__()
        self.bert = encoder
        self.qa_outputs = nn.Linear(encoder.pooler.in_features, 2)
        nn.init.normal_(self.qa_outputs.weight, std=0.02)
        nn.init.zeros_(self.qa_outputs.bias)

    def forward(self, input_ids: Tensor, segment_ids: Tensor, labels: Tensor | None = None) -> Tensor | HeadLoss:
        """(B, T) ids and segments -> (B, T, 2) start and end logits; with labels ((B, 2): the start and end
        position of each row's answer, 0 ([CLS]) for none), the summed loss as well."""
        hidden = self.bert.encode(input_ids, segment_ids)  # (B, T, d)
        logits = self.qa_outputs(hidden)  # (B, T, 2)
        if labels is None:
            return logits
        # padding is no candidate: masked, so that the width a batch is padded to leaves its loss unchanged
        pad = input_ids.eq(self.bert.pad_id).unsqueeze(1)  # (B, 1, T)
        scores = logits.float().transpose(1, 2).masked_fill(pad, float("-inf"))  # (B, 2, T)
        flat = scores.reshape(-1, logits.size(1))  # (B*2, T): each row's start scores, then its end scores
        loss = F.cross_entropy(flat, labels.reshape(-1), reduction="sum") / 2  # the mean of the two, per row
        return HeadLoss(loss, logits)
