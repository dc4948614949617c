"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

Training feeds the whole shifted target under a causal mask (teacher forcing); decoding goes one
token at a time through `start_decoding` / `decode_step`, with a key/value cache per layer and the
encoder output projected to cross-attention keys/values once per sentence.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from transformer_cli.models.layers import (
    DecoderBlock,
    Dropout,
    EncoderBlock,
    KVCache,
    init_embedding,
    residual_dtype,
    scaled_embedding,
    sinusoidal_positions,
)
from transformer_cli.models.losses import LossOutput, gather_rows, projected_smoothed_cross_entropy


@dataclass
class DecoderState:
    """What incremental decoding carries between steps."""

    memory_kv: list[tuple[Tensor, Tensor]]  # per layer, (B, H, S, d_k): once per sentence
    src_pad_mask: Tensor  # (B, S)
    caches: list[KVCache]  # per layer, (N <= B * r, H, C >= t, d_k)
    rows_per_sentence: int | None = None  # r hypothesis rows per sentence (beams); None: N / B
    step: int = 0

    def select_rows(self, index: Tensor) -> None:
        """Keep hypothesis rows `index` of the self-attention caches (beam reordering)."""
        for cache in self.caches:
            cache.select(index)

    def select_sentences(self, index: Tensor) -> None:
        """Keep sentences `index` (finished sentences leave the batch)."""
        self.memory_kv = [(k.index_select(0, index), v.index_select(0, index)) for k, v in self.memory_kv]
        self.src_pad_mask = self.src_pad_mask.index_select(0, index)


class Transformer(nn.Module):
    """Encoder-decoder Transformer; post-norm (the paper) or pre-norm."""

    def __init__(
        self,
        src_vocab_size: int,
        tgt_vocab_size: int,
        d_model: int = 512,
        heads: int = 8,
        ffn_dim: int = 2048,
        enc_layers: int = 6,
        dec_layers: int = 6,
        dropout: float = 0.1,
        attention_dropout: float = 0.0,
        activation: str = "relu",
        norm_first: bool = False,
        share_embeddings: bool = True,
        tie_output: bool = True,
        max_positions: int = 1024,
        pad_id: int = 0,
    ):
        super().__init__()
        if share_embeddings and src_vocab_size != tgt_vocab_size:
            raise ValueError("shared embeddings need one vocabulary for source and target")
        self.d_model, self.heads, self.pad_id = d_model, heads, pad_id
        self.src_embed = nn.Embedding(src_vocab_size, d_model, padding_idx=pad_id)
        self.tgt_embed = (
            self.src_embed if share_embeddings else nn.Embedding(tgt_vocab_size, d_model, padding_idx=pad_id)
        )
        self.register_buffer("positions", sinusoidal_positions(max_positions, d_model), persistent=False)
        self.dropout = Dropout(dropout)
        block = dict(
            d_model=d_model,
            heads=heads,
            ffn_dim=ffn_dim,
            dropout=dropout,
            attention_dropout=attention_dropout,
            activation=activation,
            norm_first=norm_first,
        )
        self.encoder = nn.ModuleList(EncoderBlock(**block) for _ in range(enc_layers))
        self.decoder = nn.ModuleList(DecoderBlock(**block) for _ in range(dec_layers))
        # Pre-norm leaves the residual stream un-normalised: one LayerNorm closes each stack.
        self.enc_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.dec_norm = nn.LayerNorm(d_model) if norm_first else nn.Identity()
        self.out_proj = nn.Linear(d_model, tgt_vocab_size, bias=False)
        self._init_weights()
        if tie_output:
            self.out_proj.weight = self.tgt_embed.weight

    def _init_weights(self) -> None:
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        init_embedding(self.src_embed, self.d_model, self.pad_id)
        if self.tgt_embed is not self.src_embed:
            init_embedding(self.tgt_embed, self.d_model, self.pad_id)
        nn.init.normal_(self.out_proj.weight, mean=0.0, std=self.d_model**-0.5)

    def _embed(self, emb: nn.Embedding, tokens: Tensor, offset: int = 0) -> Tensor:
        T = tokens.size(1)
        if offset + T > self.positions.size(0):
            raise ValueError(f"sequence of {offset + T} tokens exceeds max_positions ({self.positions.size(0)})")
        x = scaled_embedding(emb, tokens) + self.positions[offset : offset + T]  # (B, T, d)
        return self.dropout(residual_dtype(x))

    def encode(self, src: Tensor) -> tuple[Tensor, Tensor]:
        """src (B, S) token ids -> encoder output (B, S, d) and its padding mask (B, S)."""
        pad_mask = src.eq(self.pad_id)
        x = self._embed(self.src_embed, src)
        for block in self.encoder:
            x = block(x, pad_mask)
        return self.enc_norm(x), pad_mask

    def _project_memory(self, memory: Tensor) -> list[tuple[Tensor, Tensor]]:
        return [block.cross_attn.project_memory(memory) for block in self.decoder]

    def decode(self, tgt_in: Tensor, memory: Tensor, src_pad_mask: Tensor) -> Tensor:
        """Teacher forcing: tgt_in (B, T) -> decoder output (B, T, d), position t seeing <= t."""
        y = self._embed(self.tgt_embed, tgt_in)
        for block, kv in zip(self.decoder, self._project_memory(memory)):
            y = block(y, kv, src_pad_mask)
        return self.dec_norm(y)

    def forward(
        self, src: Tensor, tgt_in: Tensor, labels: Tensor | None = None, label_smoothing: float = 0.0
    ) -> Tensor | LossOutput:
        """Logits (B, T, V); or, given labels (B, T), the summed loss over non-padding positions."""
        memory, src_pad_mask = self.encode(src)
        hidden = self.decode(tgt_in, memory, src_pad_mask)
        if labels is None:
            return self.out_proj(hidden)
        # Project only the positions that carry a loss: padding never reaches the vocabulary matmul.
        rows, targets = gather_rows(hidden, labels, ignore=self.pad_id)  # (M, d), (M,)
        return projected_smoothed_cross_entropy(rows, self.out_proj.weight, targets, label_smoothing)

    # ------------------------------------------------------------------ incremental decoding

    def start_decoding(
        self,
        memory: Tensor,
        src_pad_mask: Tensor,
        max_len: int,
        rows_per_sentence: int | None = None,
        memory_dtype: torch.dtype | None = None,
    ) -> DecoderState:
        """Project the encoder output once (per sentence, shared by its `rows_per_sentence` hypotheses); empty
        caches for up to max_len decoded positions. With `rows_per_sentence` set, a step may carry the rows
        of fewer sentences than the memory holds: those of its first sentences. With `memory_dtype`, the
        projected keys and values are kept in that dtype, and the decoding steps' cross-attention computes in it.
        """
        caches = [KVCache(max_len) for _ in self.decoder]
        memory_kv = self._project_memory(memory)
        if memory_dtype is not None:
            memory_kv = [(k.to(memory_dtype), v.to(memory_dtype)) for k, v in memory_kv]
        return DecoderState(memory_kv, src_pad_mask, caches, rows_per_sentence)

    def decode_step(self, tokens: Tensor, state: DecoderState) -> Tensor:
        """tokens (N, 1), the last output of each hypothesis -> next-token logits (N, V)."""
        y = self._embed(self.tgt_embed, tokens, offset=state.step)  # (N, 1, d)
        for block, kv, cache in zip(self.decoder, state.memory_kv, state.caches):
            y = block(y, kv, state.src_pad_mask, cache=cache, rows_per_sentence=state.rows_per_sentence)
        state.step += 1
        return self.out_proj(self.dec_norm(y)[:, -1])
