"""BERT for pretraining (Devlin et al., 2019): a bidirectional Transformer encoder with MLM and NSP heads.

Input `[CLS] A [SEP] B [SEP]`; embeddings = token + learned position + segment, then LayerNorm and
dropout; L post-norm encoder blocks with a GELU FFN (or, with `norm_first`, pre-norm blocks and a final
LayerNorm); pooler tanh(W h_[CLS] + b) -> NSP (2 classes);
MLM head dense + GELU + LayerNorm, then a decoder tied to the token embeddings plus a bias.
During training the MLM logits are computed only at the masked positions (gather before the
vocabulary projection).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from transformer_cli.models.layers import Dropout, EncoderBlock, residual_dtype
from transformer_cli.models.losses import IGNORE, gather_rows, smoothed_cross_entropy


@dataclass
class BertLoss:
    """Sums; the trainer normalises MLM by masked positions and NSP by sequences."""

    mlm_loss: Tensor  # cross-entropy summed over masked positions
    nsp_loss: Tensor  # cross-entropy summed over sequences
    mlm_correct: Tensor  # masked positions predicted right (detached)
    nsp_correct: Tensor
    mlm_count: Tensor  # masked positions (filler rows excluded)
    nsp_count: int


class BertEmbeddings(nn.Module):
    def __init__(
        self, vocab_size: int, d_model: int, max_positions: int, segments: int, dropout: float, pad_id: int, eps: float
    ):
        super().__init__()
        self.token = nn.Embedding(vocab_size, d_model, padding_idx=pad_id)
        self.position = nn.Embedding(max_positions, d_model)
        self.segment = nn.Embedding(segments, d_model)
        self.norm = nn.LayerNorm(d_model, eps=eps)
        self.dropout = Dropout(dropout)

    def forward(self, input_ids: Tensor, segment_ids: Tensor) -> Tensor:
        T = input_ids.size(1)
        positions = torch.arange(T, device=input_ids.device)
        x = self.token(input_ids) + self.position(positions) + self.segment(segment_ids)  # (B, T, d)
        return self.dropout(self.norm(residual_dtype(x)))


# Name prefixes of the pretraining heads' parameters (MLM transform and bias, NSP): what fine-tuning leaves out.
PRETRAINING_HEADS = ("nsp_head.", "mlm_dense.", "mlm_norm.", "mlm_bias")


class Bert(nn.Module):
    """BertForPreTraining: encoder + pooler + NSP head + MLM head (tied decoder)."""

    def __init__(
        self,
        vocab_size: int,
        d_model: int = 768,
        layers: int = 12,
        heads: int = 12,
        ffn_dim: int = 3072,
        max_positions: int = 512,
        segments: int = 2,
        dropout: float = 0.1,
        attention_dropout: float = 0.1,
        norm_first: bool = False,
        pad_id: int = 0,
        eps: float = 1e-12,
        pretraining_heads: bool = True,
    ):
        super().__init__()
        self.pad_id = pad_id
        self.embeddings = BertEmbeddings(vocab_size, d_model, max_positions, segments, dropout, pad_id, eps)
        self.encoder = nn.ModuleList(
            EncoderBlock(d_model, heads, ffn_dim, dropout, attention_dropout, "gelu", norm_first, eps=eps)
            for _ in range(layers)
        )
        # Pre-norm leaves the residual stream unnormalised: one LayerNorm after the last block (Xiong et al., 2020).
        self.final_norm = nn.LayerNorm(d_model, eps=eps) if norm_first else nn.Identity()
        self.pooler = nn.Linear(d_model, d_model)
        if pretraining_heads:  # fine-tuning drops them (its head is models/heads.py)
            self.nsp_head = nn.Linear(d_model, 2)
            self.mlm_dense = nn.Linear(d_model, d_model)
            self.mlm_norm = nn.LayerNorm(d_model, eps=eps)
            self.mlm_bias = nn.Parameter(torch.zeros(vocab_size))
        self.apply(_init_weights)

    def encode(self, input_ids: Tensor, segment_ids: Tensor, first_only: bool = False) -> Tensor:
        """(B, T) ids and segments -> hidden states (B, T, d); padding (pad_id) is masked as keys.

        `first_only`: the [CLS] position's alone, (B, 1, d), the same values: the last block computes one query,
        one residual row and one FFN row per sequence instead of T (its keys and values still come from every
        position). What a sequence classifier reads; for a small BERT a fifth of the encoder's work.
        """
        pad_mask = input_ids.eq(self.pad_id)
        x = self.embeddings(input_ids, segment_ids)
        last = len(self.encoder) - 1
        for i, block in enumerate(self.encoder):
            x = block(x, pad_mask, first_only=first_only and i == last)
        return self.final_norm(x)

    def pooled(self, hidden: Tensor) -> Tensor:
        return torch.tanh(self.pooler(hidden[:, 0]))  # (B, d) from [CLS]

    def mlm_logits(self, hidden: Tensor) -> Tensor:
        """Hidden states (..., d) -> vocabulary logits (..., V) through the tied decoder."""
        h = self.mlm_norm(F.gelu(self.mlm_dense(hidden)))
        return F.linear(h, self.embeddings.token.weight, self.mlm_bias)

    def forward(
        self, input_ids: Tensor, segment_ids: Tensor, mlm_labels: Tensor | None = None, nsp_labels: Tensor | None = None
    ) -> tuple[Tensor, Tensor] | BertLoss:
        """Without labels: MLM logits (B, T, V) and NSP logits (B, 2). With labels: summed losses.

        mlm_labels (B, T) holds the original token at masked positions and IGNORE elsewhere.
        """
        hidden = self.encode(input_ids, segment_ids)
        nsp_logits = self.nsp_head(self.pooled(hidden))  # (B, 2)
        if mlm_labels is None or nsp_labels is None:
            return self.mlm_logits(hidden), nsp_logits
        # Only the ~15% masked positions reach the vocabulary projection, the largest matmul of a small BERT.
        rows, targets = gather_rows(hidden, mlm_labels, ignore=IGNORE)  # (M, d), (M,)
        logits = self.mlm_logits(rows)  # (M, V)
        mlm = smoothed_cross_entropy(logits, targets)
        nsp_loss = F.cross_entropy(nsp_logits.float(), nsp_labels, reduction="sum")
        return BertLoss(
            mlm_loss=mlm.loss,
            nsp_loss=nsp_loss,
            mlm_correct=(logits.argmax(-1) == targets).sum().detach(),
            nsp_correct=(nsp_logits.argmax(-1) == nsp_labels).sum().detach(),
            mlm_count=mlm.tokens,
            nsp_count=nsp_labels.numel(),
        )


def _init_weights(module: nn.Module) -> None:
    """BERT's initialisation: N(0, 0.02) for matrices and embeddings, zero biases, unit LayerNorm gains."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, mean=0.0, std=0.02)
        if isinstance(module, nn.Linear) and module.bias is not None:
            nn.init.zeros_(module.bias)
        if isinstance(module, nn.Embedding) and module.padding_idx is not None:
            with torch.no_grad():
                module.weight[module.padding_idx].zero_()
    elif isinstance(module, nn.LayerNorm):
        nn.init.ones_(module.weight)
        nn.init.zeros_(module.bias)
