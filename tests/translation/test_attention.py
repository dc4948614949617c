"""Attention capture, heatmaps and hard alignments (translation/attention.py, models/layers.py)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from transformer_cli.models.layers import MultiHeadAttention, attention_weights
from transformer_cli.models.transformer import Transformer
from transformer_cli.translation.attention import (
    capture,
    hard_alignment,
    teacher_forced_attention,
    to_words,
    word_index,
)

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def tiny_transformer(seed: int = 0) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(
        40, 40, d_model=32, heads=4, ffn_dim=64, enc_layers=2, dec_layers=3, dropout=0.0, max_positions=64
    ).eval()


def by_hand(
    attn: MultiHeadAttention, q_in: torch.Tensor, k_in: torch.Tensor, pad_mask: torch.Tensor | None, causal: bool
) -> torch.Tensor:
    """softmax(Q K^T / sqrt(d_k)) from the module's own projections, masks applied by hand, (B, H, T, S)."""
    B, T, d = q_in.shape
    S, H, d_k = k_in.size(1), attn.heads, attn.d_k
    if attn.cross:
        q = attn.q_proj(q_in)
        k = attn.kv_proj(k_in)[..., :d]
    else:
        q, k, _ = attn.qkv_proj(q_in).split(d, dim=-1)
    q = q.view(B, T, H, d_k).transpose(1, 2)  # (B, H, T, d_k)
    k = k.view(B, S, H, d_k).transpose(1, 2)  # (B, H, S, d_k)
    scores = q @ k.transpose(-2, -1) / d_k**0.5  # (B, H, T, S)
    allowed = torch.ones(B, 1, T, S, dtype=torch.bool)
    if pad_mask is not None:
        allowed &= ~pad_mask[:, None, None, :]
    if causal:
        allowed &= torch.ones(T, S, dtype=torch.bool).tril()
    return torch.where(allowed, scores, torch.tensor(float("-inf"))).softmax(-1)


@pytest.mark.parametrize("causal", [False, True])
def test_recorded_weights_equal_softmax_of_qk_by_hand_with_pad_mask(causal):
    torch.manual_seed(1)
    attn = MultiHeadAttention(32, 4).eval()
    x = torch.randn(3, 7, 32)
    pad_mask = torch.zeros(3, 7, dtype=torch.bool)
    pad_mask[1, 5:] = True
    pad_mask[2, 2:] = True
    attn.record = []
    with torch.no_grad():
        out = attn(x, pad_mask=None if causal else pad_mask, causal=causal)
    (weights,) = attn.record
    expected = by_hand(attn, x, x, None if causal else pad_mask, causal)
    assert weights.shape == (3, 4, 7, 7)
    torch.testing.assert_close(weights, expected, atol=1e-6, rtol=1e-5)
    assert torch.allclose(weights.sum(-1), torch.ones(3, 4, 7))
    if not causal:
        assert weights[1, :, :, 5:].abs().max() == 0 and weights[2, :, :, 2:].abs().max() == 0
    else:
        assert weights.triu(1).abs().max() == 0
    # the weights are the ones SDPA used: weights @ V through the output projection gives the output
    _, _, v = attn.qkv_proj(x).split(32, dim=-1)
    v = v.view(3, 7, 4, 8).transpose(1, 2)  # (B, H, S, d_k)
    mixed = (weights @ v).transpose(1, 2).reshape(3, 7, 32)  # (B, T, d)
    torch.testing.assert_close(attn.out_proj(mixed).detach(), out, atol=1e-5, rtol=1e-5)


def test_cross_attention_weights_by_hand():
    torch.manual_seed(2)
    attn = MultiHeadAttention(32, 4, cross=True).eval()
    y, memory = torch.randn(2, 5, 32), torch.randn(2, 6, 32)
    pad_mask = torch.tensor([[False] * 6, [False] * 3 + [True] * 3])
    attn.record = []
    with torch.no_grad():
        attn.cross_forward(y, attn.project_memory(memory), pad_mask)
    torch.testing.assert_close(attn.record[0], by_hand(attn, y, memory, pad_mask, False), atol=1e-6, rtol=1e-5)


def test_model_output_identical_with_and_without_capture():
    model = tiny_transformer()
    src = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0]])
    tgt_in = torch.tensor([[2, 11, 12, 13], [2, 14, 0, 0]])
    with torch.inference_mode():
        plain = model(src, tgt_in)
        with capture(model) as records:
            captured = model(src, tgt_in)
    assert torch.equal(plain, captured)  # bitwise: the output still comes from SDPA
    assert [len(layers) for layers in records.values()] == [2, 3, 3]
    assert records["cross"][0][0].shape == (2, 4, 4, 5)
    assert all(m.record is None for m in model.modules() if isinstance(m, MultiHeadAttention))  # switched off


def test_attention_weights_function_matches_causal_sdpa_semantics():
    q, k = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 4, 8)
    w = attention_weights(q, k, causal=True)
    assert w[0, 0, 0, 1:].abs().max() == 0 and torch.allclose(w.sum(-1), torch.ones(1, 2, 4))


def test_teacher_forced_attention_crops_padding_and_is_batch_independent():
    model = tiny_transformer()
    pairs = [([5, 6, 7], [8, 9]), ([10, 11, 12, 13, 14], [15, 16, 17, 18])]
    batched = teacher_forced_attention(model, pairs, 2, 3, torch.device("cpu"))
    alone = teacher_forced_attention(model, pairs[:1], 2, 3, torch.device("cpu"))
    assert batched[0]["cross"].shape == (3, 4, 3, 4) and batched[0]["encoder"].shape == (2, 4, 4, 4)
    assert batched[1]["decoder"].shape == (3, 4, 5, 5)
    for kind in ("encoder", "decoder", "cross"):
        np.testing.assert_allclose(batched[0][kind], alone[0][kind], atol=1e-5)
        np.testing.assert_allclose(batched[0][kind].sum(-1), 1.0, atol=1e-5)  # padding carried no weight


def test_hard_alignment_excludes_eos_and_words_merge_pieces():
    cross = np.zeros((2, 1, 4, 4), dtype=np.float32)  # (L, H, T, S): 3 target pieces + EOS, 3 source + EOS
    cross[0, 0, 0, 2] = cross[0, 0, 1, 0] = cross[0, 0, 2, 3] = 1  # target 2 attends most to source EOS ...
    cross[0, 0, 2, 1] = 0.5  # ... which is excluded: its alignment is source 1
    cross[0, 0, 3, 0] = 1  # the EOS row is not aligned
    assert hard_alignment(cross, 0) == [(2, 0), (0, 1), (1, 2)]
    assert word_index(["▁The", "▁do", "g", "."]) == [0, 1, 1, 1]
    assert to_words([(2, 0), (0, 1), (1, 2)], ["▁a", "b", "▁c"], ["▁x", "▁y", "z"]) == [(1, 0), (0, 1)]
