"""Config sections -> models, and the size presets. The only place where model code meets configuration."""

from __future__ import annotations

from transformer_cli.config import BertModelConfig, TransformerConfig
from transformer_cli.models.bert import Bert
from transformer_cli.models.transformer import Transformer
from transformer_cli.vocab.spm import PAD_ID


def build_transformer(cfg: TransformerConfig, src_vocab_size: int, tgt_vocab_size: int) -> Transformer:
    """The translation model of `cfg` for vocabularies of the given sizes."""
    return Transformer(
        src_vocab_size=src_vocab_size,
        tgt_vocab_size=tgt_vocab_size,
        d_model=cfg.d_model,
        heads=cfg.heads,
        ffn_dim=cfg.ffn_dim,
        enc_layers=cfg.enc_layers,
        dec_layers=cfg.dec_layers,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation=cfg.activation,
        norm_first=cfg.norm == "pre",
        share_embeddings=cfg.share_embeddings,
        tie_output=cfg.tie_output,
        max_positions=cfg.max_positions,
        pad_id=PAD_ID,
    )


def build_bert(cfg: BertModelConfig, vocab_size: int, pad_id: int = PAD_ID, pretraining_heads: bool = True) -> Bert:
    """BertForPreTraining of `cfg` for a vocabulary of `vocab_size` pieces (the encoder alone, for fine-tuning,
    without `pretraining_heads`; `pad_id` is the tokenizer's)."""
    return Bert(
        vocab_size=vocab_size,
        d_model=cfg.d_model,
        layers=cfg.layers,
        heads=cfg.heads,
        ffn_dim=cfg.ffn_dim,
        max_positions=cfg.max_positions,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        norm_first=cfg.norm == "pre",
        pad_id=pad_id,
        pretraining_heads=pretraining_heads,
    )
